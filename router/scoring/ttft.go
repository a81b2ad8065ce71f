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
//	est_i  = (pending_i + uncached_i) / rate_i + adapter_i
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
// A worker that would first have to load the LoRA adapter the request names
// (Request.AdapterLoad) adds the load time to est_i, so an adapter request
// goes to an engine that holds the adapter, or is loading it, until that
// engine's queue costs more than a load elsewhere.
//
// Without prompt tokens est_i is the queue and the adapter load alone, and
// when no worker has a load to pay every worker scores Neutral.
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
	load, loading := adapterLoads(req, workers)
	tokens, err := req.PromptTokens(ctx)
	known := err == nil && len(tokens) > 0
	if !known && !loading {
		return
	}
	if known {
		t.Prefix.match(ctx, req, workers)
	}
	minEst := -1.0
	for i, w := range workers {
		var un int64 // without tokens: only the queue and the adapter load
		if known {
			un = uncached(req, w)
		}
		out[i] = w.Signals().EstimatedTTFT(un).Seconds()
		if load != nil {
			out[i] += load[i].Seconds()
		}
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

// adapterLoads returns each worker's adapter load time (req.AdapterLoad),
// nil without one, and whether any worker has one to pay.
func adapterLoads(req *Request, workers []*Worker) ([]time.Duration, bool) {
	if req.AdapterLoad == nil {
		return nil, false
	}
	var d []time.Duration // allocated at the first load: most requests name no adapter
	for i, w := range workers {
		if l := req.AdapterLoad(w); l > 0 {
			if d == nil {
				d = make([]time.Duration, len(workers))
			}
			d[i] = l
		}
	}
	return d, d != nil
}
