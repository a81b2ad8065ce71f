package scoring

import (
	"context"
	"time"
)

// DefaultTTFTScale is the ttft term's τ (see TTFTTerm).
const DefaultTTFTScale = 250 * time.Millisecond

// TTFTTerm ("ttft") prefers the worker that will return the request's first
// token soonest, by the router's own prefill model of each worker:
//
//	est_i  = (pending_i + uncached_i) / rate_i
//	ttft_i = (τ + min_j est_j) / (τ + est_i)
//
// pending_i is the uncached prompt tokens the router has sent to worker i and
// not yet seen a first token for, uncached_i is this prompt less the prefix
// the prefix match found in i's cache, and rate_i is the prefill throughput
// the router learned from i's observed first-token times (Live.StartPrefill;
// DefaultPrefillRate until measured). The fastest worker scores 1. τ keeps
// short prompts, whose estimates differ by milliseconds, from mattering: they
// are left to the other terms, while a long uncached prompt goes to a fast,
// idle worker, or to one that holds its prefix, instead of queueing behind
// other prompts on a slow GPU. On a heterogeneous cluster that is where the
// tail of TTFT comes from.
//
// The term needs prompt tokens; without them every worker scores Neutral.
type TTFTTerm struct {
	// Prefix supplies the per-worker cache match (shared with the prefix
	// term, computed once per request). Nil: uncached_i is the whole prompt.
	Prefix *PrefixTerm
	// Scale is τ; zero means DefaultTTFTScale.
	Scale time.Duration
}

// NewTTFTTerm returns the term over the prefix term's match.
func NewTTFTTerm(prefix *PrefixTerm) *TTFTTerm { return &TTFTTerm{Prefix: prefix} }

func (*TTFTTerm) Name() string { return "ttft" }

// Score implements Term.
func (t *TTFTTerm) Score(ctx context.Context, req *Request, workers []*Worker, out []float64) {
	for i := range workers {
		out[i] = Neutral
	}
	if len(workers) == 0 {
		return
	}
	tokens, err := req.PromptTokens(ctx)
	if err != nil || len(tokens) == 0 {
		return
	}
	t.Prefix.match(ctx, req, workers)
	minEst := -1.0
	for i, w := range workers {
		out[i] = w.Signals().EstimatedTTFT(uncached(req, w)).Seconds()
		if minEst < 0 || out[i] < minEst {
			minEst = out[i]
		}
	}
	tau := t.Scale.Seconds()
	if tau <= 0 {
		tau = DefaultTTFTScale.Seconds()
	}
	for i := range out[:len(workers)] {
		out[i] = (tau + minEst) / (tau + out[i])
	}
}
