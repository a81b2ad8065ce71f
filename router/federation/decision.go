package federation

import (
	"time"

	"github.com/oasis-llm/oasis/router/policy"
)

// Reason says why a request leaves its datacenter.
type Reason string

// Reasons a request is forwarded (metric label values).
const (
	ReasonNoLocalWorker Reason = "no_local_worker"
	ReasonSaturated     Reason = "saturated"
	ReasonPrefix        Reason = "prefix"
)

// Local is what the router knows of its own datacenter for one request.
type Local struct {
	Healthy   bool          // a healthy local worker serves the model
	Saturated bool          // local admission would refuse the request (queue full)
	QueueWait time.Duration // estimated wait for a local admission slot
	// CachedTokens is the prompt prefix the chosen local worker holds;
	// PromptTokens the whole prompt (0: unknown, no prefix term).
	CachedTokens, PromptTokens int64
	// PrefillRate is the local worker's prefill throughput, tokens/s; a
	// remote GPU of the same model is taken to prefill as fast.
	PrefillRate float64
}

// Remote is one datacenter's offer for the request, from its summary.
type Remote struct {
	DC        string
	RTT       time.Duration // measured round trip to its router
	QueueWait time.Duration // its estimated admission wait
	TTFT      time.Duration // its estimated time to first token, queue excluded
	// CachedTokens is the prompt prefix its hot-prefix filter may hold.
	CachedTokens int64
	// Usable: the summary is fresh, the breaker lets a request through, it
	// has free capacity and serves the model.
	Usable bool
}

// Decision is where a request goes: DC "" is local.
type Decision struct {
	DC     string
	Reason Reason
}

// Decide chooses where one request is served. It is a pure function of its
// arguments:
//
//	cost_r  = RTT_r + wait_r + ttft_r                  (remote r, usable only)
//	(a) no healthy local worker        → usable r with the least cost_r
//	(b) local saturated, or
//	    wait_local > queue_wait_budget → r with the least cost_r, when
//	                                     cost_r < wait_local (or local is saturated)
//	(c) saving_r = (cached_r − cached_local) / prefill_rate
//	    forward when saving_r > RTT_r + wait_r − wait_local + margin,
//	    to the r with the largest saving_r − (RTT_r + wait_r − wait_local)
//
// Otherwise, and always for a request that already crossed a datacenter
// (forwarded), or when spilling is paused (spill budget) for (b) and (c),
// it serves locally. (a) ignores the spill budget: local cannot serve at all.
func Decide(s policy.FederationSettings, forwarded, spillPaused bool, l Local, remotes []Remote) Decision {
	if !s.Enabled || forwarded {
		return Decision{}
	}
	if !l.Healthy {
		if r, ok := cheapest(remotes); ok {
			return Decision{DC: r.DC, Reason: ReasonNoLocalWorker}
		}
		return Decision{}
	}
	if spillPaused {
		return Decision{}
	}
	if l.Saturated || l.QueueWait > s.QueueWaitBudget {
		if r, ok := cheapest(remotes); ok && (l.Saturated || cost(r) < l.QueueWait) {
			return Decision{DC: r.DC, Reason: ReasonSaturated}
		}
		return Decision{}
	}
	rate := l.PrefillRate
	if rate <= 0 || l.PromptTokens <= 0 {
		return Decision{}
	}
	best, bestGain := Decision{}, time.Duration(0)
	for _, r := range remotes {
		if !r.Usable || r.CachedTokens <= l.CachedTokens {
			continue
		}
		saving := time.Duration(float64(r.CachedTokens-l.CachedTokens) / rate * float64(time.Second))
		extra := r.RTT + r.QueueWait - l.QueueWait
		if saving > extra+s.Margin && saving-extra > bestGain {
			best, bestGain = Decision{DC: r.DC, Reason: ReasonPrefix}, saving-extra
		}
	}
	return best
}

func cost(r Remote) time.Duration { return r.RTT + r.QueueWait + r.TTFT }

// cheapest returns the usable remote with the least cost.
func cheapest(remotes []Remote) (Remote, bool) {
	var best Remote
	found := false
	for _, r := range remotes {
		if r.Usable && (!found || cost(r) < cost(best)) {
			best, found = r, true
		}
	}
	return best, found
}
