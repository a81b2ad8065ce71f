package scoring

import (
	"context"
	"math"
	"sync"
	"sync/atomic"

	"github.com/oasis-llm/oasis/router/prefixindex"
	rworker "github.com/oasis-llm/oasis/router/worker"
)

// PrefixSource is the router's view of cache contents (cachestate.State
// implements it): it turns prompt tokens into block keys and matches them.
type PrefixSource interface {
	Keys(dst []uint64, model string, blockSize int, tokens []uint32) ([]uint64, error)
	Match(keys []uint64, w prefixindex.TierWeights, out []prefixindex.Match) []prefixindex.Match
}

// AdapterKeySource is a PrefixSource that also computes keys in a LoRA
// adapter's domain (cachestate.State does): a request naming an adapter is
// matched against the blocks engines cached for that adapter only.
type AdapterKeySource interface {
	AdapterKeys(dst []uint64, model, adapter string, blockSize int, tokens []uint32) ([]uint64, error)
}

// keys computes the request's keys for w: in the domain of the LoRA
// adapter the request names, when it names one of w's.
func (t *PrefixTerm) keys(dst []uint64, req *Request, w *Worker, bs int, tokens []uint32) ([]uint64, error) {
	if a := w.Adapter(req.Model); a != "" {
		if as, ok := t.Source.(AdapterKeySource); ok {
			return as.AdapterKeys(dst, w.Model, a, bs, tokens)
		}
		return nil, nil // no adapter domain to match in
	}
	return t.Source.Keys(dst, w.Model, bs, tokens)
}

// DefaultBlockSize is assumed for workers that do not advertise oasis_block_size.
const DefaultBlockSize = rworker.DefaultBlockSize

// DefaultLoadSlack is the hot-spot guard's ε (see PrefixTerm). 0.5, not the
// 0.25 it was: on the Mooncake trace in the cluster simulator (BENCHMARKS.md,
// "Routing on the Mooncake trace") 0.25 withdrew prefix credit from workers at
// 1.25× the mean load, so at high load requests left their cached prefix (16
// identical H100s: 35.9 req/s at the SLO, below SGLang's cache_aware at 42.6);
// 0.5 sustains 43.4 there and no configuration measured did worse than with
// 0.25. 1.0 was measured too: lower TTFT on the synthetic workload, but only
// SGLang's rate on the identical GPUs, and twice the mean on a hot prefix's
// holder instead of 1.5×.
const DefaultLoadSlack = 0.5

// DefaultLoadFloor is the hot-spot guard's smallest bound, in requests.
const DefaultLoadFloor = 4

// PrefixTerm ("prefix") prefers the worker that already holds the longest
// prefix of the request's prompt in its KV cache:
//
//	prefix_i = Σ_{matched blocks b} tierWeight(b) / request blocks
//
// with tier weights GPU 1.0, CPU 0.75, disk 0.25, peer 0.5 by default, so a
// worker holding the whole prompt in GPU memory scores 1.
//
// Hot-spot guard (bounded-load affinity, after Mirrokni et al.'s consistent
// hashing with bounded loads): a worker whose load is at or above
//
//	bound = max(⌈(1+ε) · (Σ_j L_j + 1) / n⌉, floor)
//
// gets no prefix credit. (The floor, a few requests, keeps affinity at low
// load, where a worker with one request in its batch is not overloaded.) When every request starts with one shared system
// prompt, the first worker that caches it would otherwise win every request.
// With the bound, once that worker carries (1+ε)× its fair share the next
// requests go to other workers (chosen by load and their own overlap), which
// then cache the prompt too: a hot prefix is replicated on as many workers as
// its traffic needs, and max/mean load stays near 1+ε, while requests whose
// prefix sits on an unloaded worker still go there.
type PrefixTerm struct {
	Source PrefixSource
	// LoadSlack is ε; a negative value disables the guard (pure affinity,
	// the "prefix-only" baseline of the routing benchmark).
	LoadSlack float64
	// LoadFloor is the smallest bound (default DefaultLoadFloor).
	LoadFloor float64

	tiers atomic.Pointer[prefixindex.TierWeights]
	pool  sync.Pool // *prefixScratch
}

type prefixScratch struct {
	keys    []uint64
	matches []prefixindex.Match
}

// NewPrefixTerm returns the term over src with default tier weights and guard.
func NewPrefixTerm(src PrefixSource) *PrefixTerm {
	return &PrefixTerm{Source: src, LoadSlack: DefaultLoadSlack, LoadFloor: DefaultLoadFloor}
}

// SetTierWeights changes the tier weights (from the policy document).
func (t *PrefixTerm) SetTierWeights(w prefixindex.TierWeights) { t.tiers.Store(&w) }

// TierWeights returns the tier weights in use.
func (t *PrefixTerm) TierWeights() prefixindex.TierWeights {
	if w := t.tiers.Load(); w != nil {
		return *w
	}
	return prefixindex.DefaultTierWeights()
}

func (*PrefixTerm) Name() string { return "prefix" }

// Score implements Term. Requests without prompt tokens (no tokenizer for the
// model) score Neutral everywhere.
func (t *PrefixTerm) Score(ctx context.Context, req *Request, workers []*Worker, out []float64) {
	for i := range workers {
		out[i] = Neutral
	}
	if !t.match(ctx, req, workers) {
		return
	}
	for i, w := range workers {
		h, ok := req.prefixHits[w.ID]
		if !ok || h.keys == 0 {
			continue // its (model, block size) had no keys: no information
		}
		out[i] = clamp01(h.weighted / float64(h.keys))
	}
	t.guard(workers, out)
}

// match finds, once per request, how much of the prompt each worker holds and
// leaves it on req (prefixHits). Every term that needs the match calls it; the
// first does the work. It reports false when there is nothing to match (no
// source, no tokens).
func (t *PrefixTerm) match(ctx context.Context, req *Request, workers []*Worker) bool {
	if req.prefixDone {
		return req.prefixHits != nil
	}
	req.prefixDone = true
	if t == nil || t.Source == nil || len(workers) == 0 {
		return false
	}
	tokens, err := req.PromptTokens(ctx)
	if err != nil || len(tokens) == 0 {
		return false
	}
	sc, _ := t.pool.Get().(*prefixScratch)
	if sc == nil {
		sc = &prefixScratch{}
	}
	defer t.pool.Put(sc)
	tiers := t.TierWeights()
	req.prefixHits = make(map[string]prefixHit, len(workers))

	// Workers of one model normally share a block size: one digest pass and
	// one index match per distinct (model, block size).
	done := make([]bool, len(workers))
	for i, w := range workers {
		if done[i] {
			continue
		}
		bs := BlockSizeOf(w)
		keys, err := t.keys(sc.keys[:0], req, w, bs, tokens)
		sc.keys = keys
		if err != nil {
			keys = nil
		}
		if len(keys) > 0 {
			sc.matches = t.Source.Match(keys, tiers, sc.matches[:0])
			req.prefixKeys = append(req.prefixKeys[:0], keys...)
		}
		for j := i; j < len(workers); j++ {
			wj := workers[j]
			if done[j] || wj.Model != w.Model || BlockSizeOf(wj) != bs || wj.Adapter(req.Model) != w.Adapter(req.Model) {
				continue
			}
			done[j] = true
			h := prefixHit{keys: len(keys)}
			if len(keys) > 0 {
				for _, m := range sc.matches {
					if m.Worker == wj.ID {
						h.blocks, h.weighted = m.Blocks, m.Weighted
						h.gpu, h.inflight = int32(m.GPUBlocks), int32(m.Inflight) // at most the prompt's blocks
						break
					}
				}
			}
			req.prefixHits[wj.ID] = h
		}
	}
	return true
}

// guard zeroes the prefix credit of workers at or above the load bound.
func (t *PrefixTerm) guard(workers []*Worker, out []float64) {
	if t.LoadSlack < 0 || len(workers) < 2 {
		return
	}
	total := 0.0
	loads := make([]float64, len(workers))
	for i, w := range workers {
		loads[i] = w.Signals().Load()
		total += loads[i]
	}
	bound := math.Max(math.Ceil((1+t.LoadSlack)*(total+1)/float64(len(workers))), t.LoadFloor)
	for i, l := range loads {
		if l >= bound {
			out[i] = 0
		}
	}
}

// BlockSizeOf is the block size the router assumes for w: its
// oasis_block_size, else DefaultBlockSize.
func BlockSizeOf(w *Worker) int { return rworker.BlockSizeOf(w) }
