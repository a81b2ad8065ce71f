package federation

import (
	"errors"
	"slices"
	"time"

	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Request is what the gateway knows of one request when it asks Route.
type Request struct {
	Model     string
	Forwarded bool // it arrived from another datacenter (Forwarded)
	Local     Local
	// Keys are the prompt's block keys (scoring's prefix keys) at BlockSize
	// tokens per block; nil when unknown.
	Keys      []uint64
	BlockSize int
}

// Settings returns the current federation settings.
func (f *Federation) Settings() policy.FederationSettings { return f.cfg.Policy() }

// Arrived counts a request for the spill budget's share: call it once per
// request that may be routed.
func (f *Federation) Arrived() { f.spill.Record(f.cfg.now(), false) }

// Route decides where req goes: Decide over the fresh summaries.
func (f *Federation) Route(req Request) Decision {
	s := f.cfg.Policy()
	if !s.Enabled || req.Forwarded {
		return Decision{}
	}
	now := f.cfg.now()
	paused := f.spill.Paused(now, s.MaxSpillFraction, s.ResumeSpillFraction)
	return Decide(s, req.Forwarded, paused, req.Local, f.remotes(req, s, now))
}

// remotes are the datacenters' offers for req: each the sum of its
// routers' fresh summaries (remoteDC.merged).
func (f *Federation) remotes(req Request, s policy.FederationSettings, now time.Time) []Remote {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]Remote, 0, len(f.remote))
	for dc, rd := range f.remote {
		m, cached, fresh, ok := rd.merged(req.Model, req.Keys, now, s.SummaryStale)
		if !ok {
			continue
		}
		rtt := rd.rtt
		if rtt == 0 {
			rtt = f.cfg.PushTimeout // never measured: assume the worst a push may take
		}
		r := Remote{DC: dc, RTT: rtt, QueueWait: m.QueueWait, TTFT: m.TTFT,
			CachedTokens: int64(cached) * int64(req.BlockSize)}
		r.Usable = fresh > 0 && m.Free > 0 && rd.breaker.usable(now, s.BreakerCooldown)
		out = append(out, r)
	}
	return out
}

// Target is where a forwarded request goes.
type Target struct {
	DC   string
	Addr string        // the peer router's federation listener
	RTT  time.Duration // smoothed round trip
	// Live counts this router's requests in flight to the datacenter.
	Live *scoring.Live
}

// ErrNoPeer: the datacenter has no known router for the model, or its
// breaker refused the request.
var ErrNoPeer = errors.New("federation: no usable router in that datacenter")

// Begin returns where to send a request for model that d sends away,
// taking the breaker's probe when it is half-open (End must follow), and
// counts it as forwarded and against the spill budget.
func (f *Federation) Begin(d Decision, model string) (Target, error) {
	var cands []Peer
	for _, p := range f.allPeers() {
		if p.DC == d.DC && (p.Models == nil || slices.Contains(p.Models, model)) {
			cands = append(cands, p)
		}
	}
	now := f.cfg.now()
	f.mu.Lock()
	rd := f.remoteLocked(d.DC)
	rtt := rd.rtt
	f.mu.Unlock()
	if len(cands) == 0 || !rd.breaker.allow(now, f.cfg.Policy().BreakerCooldown) {
		return Target{}, ErrNoPeer
	}
	f.spill.Spilled(now)
	f.m.forwarded.WithLabelValues(d.DC, string(d.Reason)).Inc()
	p := cands[f.rr.Add(1)%uint64(len(cands))]
	return Target{DC: d.DC, Addr: p.Addr, RTT: rtt, Live: rd.live}, nil
}

// End reports a forwarded request's outcome to the datacenter's breaker:
// ok false for a failure before the first byte.
func (f *Federation) End(dc string, ok bool) {
	f.mu.Lock()
	rd := f.remoteLocked(dc)
	f.mu.Unlock()
	if !ok {
		f.m.forwardFailures.WithLabelValues(dc).Inc()
	}
	st := rd.breaker.report(ok, f.cfg.now(), f.cfg.Policy().BreakerFailures)
	f.m.breaker.WithLabelValues(dc).Set(float64(st))
}
