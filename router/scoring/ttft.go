package scoring

import (
	"context"
	"time"
)

// DefaultTTFTScale is the ttft term's τ (see TTFTTerm).
const DefaultTTFTScale = 250 * time.Millisecond

// DefaultRecompute is the ttft term's κ (see TTFTTerm): a worker that would
// recompute prompt tokens another candidate holds in cache is charged them
// κ times more, as the prefill its choice adds to the cluster. Chosen on
// three training families of the cluster benchmark's trace library
// (agentic, multi-tenant, Mooncake conversation) at the generators'
// sustained length, with KV events and without, from 0, 1, 2, 4, 8 and 16
// (κ_f below κ): 4 is the smallest at the best throughput at SLO on all
// three in both modes (with events: agentic 140.9 req/s at 2, 4 and 8,
// multi-tenant 346.1 at 8, 362.2 at 2 and 4; without: agentic 103.8 at 2,
// 148.3 at 4 and 8; conversation equal throughout), then reported on the
// held-out families (BENCHMARKS.md, "Routing across a trace library";
// router/README.md).
const DefaultRecompute = 4.0

// DefaultInflightRecompute is the ttft term's κ_f (see TTFTTerm): the
// charge for recomputing tokens that only an in-flight copy holds (the
// router sent them and the engine's KV events have not confirmed them).
// Lower than κ so a hot prefix's early followers may replicate it (as they
// did before the router recorded its decisions), while a session's next
// turn still waits for its holder. Measured with KV events and the in-flight
// record from 0, 1, 2, 3, 4, 6 and 8 (BENCHMARKS.md, "Where a peer wins, and
// why"): 2 is the smallest that keeps the training families' throughput at
// SLO at 16 mixed and 64 GPUs (agentic at 64 GPUs: 166.0 at 1, 221.3 at 2,
// 110.6 at 4), and it recovers mixed short/long (84.8 → 118.7 req/s at 16)
// and RAG at 64 GPUs (387.5 → 516.6).
const DefaultInflightRecompute = 2.0

// TTFTTerm ("ttft") prefers the worker that will return the request's first
// token soonest, by the router's own prefill model of each worker, and
// charges a worker that would recompute what another holds for the work
// that adds:
//
//	est_i  = (pending_i + uncached_i + charge_i) / rate_i + adapter_i
//	ttft_i = (τ + min_j est_j) / (τ + est_i)
//	charge_i = κ·max(0, uncached_i − C) + κ_f·max(0, min(uncached_i, C) − A)
//	C = min_j confirmed-uncached_j,  A = min_j uncached_j
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
// κ (Recompute) prices the move away from the prefix holder beyond this
// request: the tokens worker i would compute that the best-matching worker
// has cached are prefill the cluster did not need, and the requests that
// follow the same prefix (a session's next turns, a tenant's next requests)
// then find it split across two workers. Without it (κ = 0) the estimate is
// this request's wait alone, and a holder with a short queue loses its
// session to an idle worker that recomputes the whole context, which raises
// every worker's queue and moves more sessions.
//
// κ_f (InflightRecompute) is the charge for tokens that only an in-flight
// copy holds: with KV events the router also counts the prompts it sent
// and the engine has not yet confirmed (cachestate.InflightMatcher,
// prefixindex.Match.Inflight), and confirmed-uncached_j counts only the
// engine's own report. A worker is charged κ for what a confirmed holder
// has and κ_f for what is held only in flight. With κ for both, every
// request that follows a new prefix stayed on its first worker until that
// worker's queue reached (1 + κ) times the prefix: a hot prefix (a RAG
// document, a group's system prompt) was not replicated early, and the
// holder's queue grew (RAG at 64 GPUs: imbalance 2.42 → 3.30). Without
// KV events (approximate learning) every match counts as confirmed.
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
	// Recompute is κ; zero, less or NaN charges nothing beyond this
	// request's wait (NewTTFTTerm sets DefaultRecompute).
	Recompute float64
	// InflightRecompute is κ_f, charged instead of κ for tokens only an
	// in-flight copy holds; zero, less or NaN charges nothing for them
	// (NewTTFTTerm sets DefaultInflightRecompute).
	InflightRecompute float64
}

// NewTTFTTerm returns the term over the prefix term's match, with the
// default κ and κ_f.
func NewTTFTTerm(prefix *PrefixTerm) *TTFTTerm {
	return &TTFTTerm{Prefix: prefix, Recompute: DefaultRecompute, InflightRecompute: DefaultInflightRecompute}
}

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
		t.chargedTokens(req, workers, out)
	} else {
		clear(out[:len(workers)]) // without tokens: only the queue and the adapter load
	}
	minEst := -1.0
	for i, w := range workers {
		out[i] = w.Signals().EstimatedTTFT(int64(out[i])).Seconds()
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

// chargedTokens writes into out the prompt tokens each worker's estimate
// counts: its uncached tokens plus κ times those of them a confirmed holder
// has and κ_f times those only an in-flight holder has.
func (t *TTFTTerm) chargedTokens(req *Request, workers []*Worker, out []float64) {
	minUn, minAll := int64(-1), -1.0
	for i, w := range workers {
		out[i] = float64(uncached(req, w))
		if un := unconfirmed(req, w); minUn < 0 || un < minUn {
			minUn = un
		}
		if minAll < 0 || out[i] < minAll {
			minAll = out[i]
		}
	}
	if !(t.Recompute > 0) { // zero, negative or NaN: no charge
		return
	}
	kf := t.InflightRecompute
	if !(kf > 0) {
		kf = 0
	}
	conf := float64(minUn)
	for i := range out[:len(workers)] {
		out[i] += t.Recompute*max(0, out[i]-conf) + kf*max(0, min(out[i], conf)-minAll)
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
