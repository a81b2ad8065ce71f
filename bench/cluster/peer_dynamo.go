package cluster

import "math"

// NVIDIA Dynamo's KV router, read from ai-dynamo/dynamo
// lib/llm/src/kv_router/scheduler.rs and docs/architecture/kv_cache_routing.md
// (v0.4–v0.6): for each worker
//
//	cost = overlap_score_weight × prefill_blocks + decode_blocks
//
// prefill_blocks = (the worker's prompt tokens still being prefilled + this
// prompt's tokens beyond the worker's cached overlap) / block size;
// decode_blocks = (the worker's active tokens, prompt and output of its
// requests in flight, + this prompt's tokens) / block size. Defaults:
// overlap_score_weight 1, router_temperature 0 (the lowest cost; ties to the
// lowest index here). With a temperature T > 0 the costs are min-max
// normalised and a worker drawn with probability ∝ exp(−normalised / T)
// (softmax_sample). The overlap comes from KV events (KvIndexer), or without
// them from its ApproxKvIndexer: the router's own decisions, expiring after
// 120 s. Not modelled: ActiveSequences' de-duplication of blocks shared by a
// worker's active requests (active tokens are summed per request).
type dynamoPeer struct {
	ev          bool
	temperature float64
	blockSize   float64
	tree        *approxTree
	costs       []float64
}

const (
	dynamoOverlapWeight = 1.0
	dynamoApproxTTL     = 120e9 // ns
)

func newDynamo(n int, ev bool, temperature float64, blockSize int) *dynamoPeer {
	p := &dynamoPeer{ev: ev, temperature: temperature, blockSize: float64(max(1, blockSize)), costs: make([]float64, n)}
	if !ev {
		p.tree = newApproxTree(n, 1, dynamoApproxTTL, 0, 0)
	}
	return p
}

func (p *dynamoPeer) events() bool { return p.ev }

// overlap returns each worker's cached prefix in engine blocks.
func (p *dynamoPeer) overlap(v *peerView) []int {
	if p.ev {
		return v.eventMatch()
	}
	return p.tree.match(v.keys, v.now)
}

func (p *dynamoPeer) pick(v *peerView) int {
	ov := p.overlap(v)
	for i := range p.costs {
		pl := v.s.workers[i].pl
		newTok := max(0, v.input-ov[i]*int(p.blockSize))
		p.costs[i] = dynamoCost(pl.prefill, int64(newTok), pl.active, int64(v.input), p.blockSize, dynamoOverlapWeight)
	}
	w := softmaxSample(p.costs, p.temperature, v.s.rng.Float64)
	v.uncached = max(0, v.input-ov[w]*int(p.blockSize))
	return w
}

// dynamoCost is Dynamo's per-worker logit in blocks.
func dynamoCost(prefilling, newTokens, active, prompt int64, blockSize, overlapWeight float64) float64 {
	prefill := float64(prefilling+newTokens) / blockSize
	decode := float64(active+prompt) / blockSize
	return overlapWeight*prefill + decode
}

// softmaxSample is Dynamo's selection: temperature 0 the lowest cost, else
// costs min-max normalised to [0, 1] and sampled with weights exp(−c / T)
// (all equal: uniform).
func softmaxSample(costs []float64, temperature float64, rnd func() float64) int {
	best := 0
	lo, hi := costs[0], costs[0]
	for i, c := range costs {
		if c < costs[best] {
			best = i
		}
		lo, hi = min(lo, c), max(hi, c)
	}
	if temperature <= 0 {
		return best
	}
	w := make([]float64, len(costs))
	total := 0.0
	for i, c := range costs {
		n := 0.0
		if hi > lo {
			n = (c - lo) / (hi - lo)
		}
		w[i] = math.Exp(-n / temperature)
		total += w[i]
	}
	x := rnd() * total
	for i, wi := range w {
		if x < wi {
			return i
		}
		x -= wi
	}
	return len(w) - 1
}

func (p *dynamoPeer) routed(v *peerView, w int) {
	if p.tree != nil {
		p.tree.store(w, v.keys, v.now)
	}
}
