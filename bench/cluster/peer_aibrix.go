package cluster

import (
	"math"
	"sort"
)

// AIBrix gateway's prefix-cache routing, read from vllm-project/aibrix
// pkg/plugins/gateway/algorithms/prefix_cache.go and
// pkg/utils/prefixcacheindexer/hash.go (commit 0871c21), code defaults:
// AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT 8,
// AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR 1,
// AIBRIX_PREFIX_CACHE_BLOCK_NUMBER 200,000 blocks (LRU), entries expire
// after AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS 20; blocks of 128 tokens
// (the documented default for its character tokenizer and the Helm chart's
// value):
//
//   - running requests per pod max − min > 8: the pod with the fewest;
//   - else the pods holding a prefix of the prompt in the gateway's own
//     prefix hash table, by match percentage descending then running
//     requests ascending; the first whose running requests are ≤ mean + 1 ×
//     standard deviation over all pods wins; none (or no match): the pod with
//     the fewest running requests;
//   - the prompt's block hashes are then added under the chosen pod.
type aibrixPeer struct {
	tree *approxTree
}

const (
	aibrixImbalanceAbs = 8
	aibrixStdFactor    = 1.0
	aibrixBlock        = 128 // tokens
	aibrixBlocks       = 200000
	aibrixTTL          = 20 * 60e9 // ns
)

func newAIBrix(n int) *aibrixPeer {
	return &aibrixPeer{tree: newApproxTree(n, aibrixBlock/16, aibrixTTL, 0, aibrixBlocks)}
}

func (p *aibrixPeer) events() bool { return false }

func (p *aibrixPeer) pick(v *peerView) int {
	lo, hi := v.inFlight(0), v.inFlight(0)
	mean := 0.0
	for i := range v.workers() {
		lo, hi = min(lo, v.inFlight(i)), max(hi, v.inFlight(i))
		mean += float64(v.inFlight(i))
	}
	if hi-lo > aibrixImbalanceAbs {
		return leastInFlight(v)
	}
	mean /= float64(v.workers())
	varsum := 0.0
	for i := range v.workers() {
		d := float64(v.inFlight(i)) - mean
		varsum += d * d
	}
	limit := mean + aibrixStdFactor*math.Sqrt(varsum/float64(v.workers()))
	lens := p.tree.match(v.keys, v.now)
	var cands []int
	for i, n := range lens {
		if n > 0 {
			cands = append(cands, i)
		}
	}
	sort.SliceStable(cands, func(a, b int) bool {
		if lens[cands[a]] != lens[cands[b]] {
			return lens[cands[a]] > lens[cands[b]]
		}
		return v.inFlight(cands[a]) < v.inFlight(cands[b])
	})
	for _, c := range cands {
		if float64(v.inFlight(c)) <= limit {
			return c
		}
	}
	return leastInFlight(v)
}

func (p *aibrixPeer) routed(v *peerView, w int) { p.tree.store(w, v.keys, v.now) }
