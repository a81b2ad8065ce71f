package worker

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultPrefillRate is the prefill throughput, in uncached prompt tokens per
// second, assumed for a worker the router has not yet measured. It is
// optimistic on purpose (an H100 prefills an 8B model at ~30k tokens/s): an
// unmeasured worker looks fast, so it gets a long prompt and is measured. A
// pessimistic seed would keep the first measured worker winning even when an
// untried one is three times faster.
const DefaultPrefillRate = 50000

// MinPrefillSample is the least work (uncached tokens, queued ones included)
// a first token must have waited for to teach the rate: below it the time is
// mostly per-step overhead, not prompt computation.
const MinPrefillSample = 1024

// prefillDecay is the weight kept by the older samples at each new one
// (about the last 10 long prompts count).
const prefillDecay = 0.9

// prefillState is the router's own model of a worker's prefill queue:
// uncached prompt tokens it sent and has not yet seen a first token for, and
// the throughput at which the worker turns such tokens into first tokens.
type prefillState struct {
	pending atomic.Int64

	mu       sync.Mutex
	tok, sec float64 // exponentially decayed sums of sample work and time
}

// rate returns the learned tokens per second, or DefaultPrefillRate.
func (p *prefillState) rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.sec <= 0 || p.tok <= 0 {
		return DefaultPrefillRate
	}
	return p.tok / p.sec
}

// observe adds one sample: work tokens were ahead of (and including) a
// request whose first token came after d.
func (p *prefillState) observe(work int64, d time.Duration) {
	if work < MinPrefillSample || d <= 0 {
		return
	}
	p.mu.Lock()
	// A ratio of decayed sums, not an average of ratios: long prompts, whose
	// time is almost all prompt computation, dominate the estimate.
	p.tok = prefillDecay*p.tok + float64(work)
	p.sec = prefillDecay*p.sec + d.Seconds()
	p.mu.Unlock()
}

// Prefill is one request's uncached prompt tokens waiting on a worker. Call
// FirstToken when its first token arrives, or Cancel when no first-token time
// will be seen (failure, non-streaming response); either ends it, once.
type Prefill struct {
	live   *Live
	st     *prefillState
	tokens int64
	ahead  int64 // pending tokens when it was sent, its own excluded
	once   sync.Once
}

// StartPrefill records that a request with tokens uncached prompt tokens (its
// prompt less what the worker is believed to hold in cache) was sent to the
// worker. The gateway and the cluster simulator call it for every request they
// forward; the ttft term reads the pending sum and the learned rate.
func (l *Live) StartPrefill(tokens int64) *Prefill {
	tokens = max(tokens, 0)
	ahead := l.prefill.pending.Add(tokens) - tokens
	l.changed()
	return &Prefill{live: l, st: &l.prefill, tokens: tokens, ahead: ahead}
}

// FirstToken ends the prefill and teaches the worker's rate: the tokens that
// were ahead of it and its own were done in ttft.
func (p *Prefill) FirstToken(ttft time.Duration) {
	if p == nil {
		return
	}
	p.once.Do(func() {
		p.st.pending.Add(-p.tokens)
		p.st.observe(p.ahead+p.tokens, ttft)
		p.live.changed()
	})
}

// Cancel ends the prefill without a sample.
func (p *Prefill) Cancel() {
	if p == nil {
		return
	}
	p.once.Do(func() { p.st.pending.Add(-p.tokens); p.live.changed() })
}

// EstimatedTTFT is the time the worker needs before it can return the first
// token of a request with uncached prompt tokens: its pending prefill tokens
// (this router's and its peers') plus these, at its learned prefill rate.
func (s Signals) EstimatedTTFT(uncached int64) time.Duration {
	rate := s.PrefillRate
	if rate <= 0 || math.IsNaN(rate) {
		rate = DefaultPrefillRate
	}
	sec := float64(max(s.PendingPrefillTokens, 0)+max(s.PeerPendingPrefillTokens, 0)+max(uncached, 0)) / rate
	return time.Duration(sec * float64(time.Second))
}
