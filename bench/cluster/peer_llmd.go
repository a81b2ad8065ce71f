package cluster

// llm-d's inference scheduler (EPP), default scheduling profile of its
// precise-prefix-cache well-lit path, read from llm-d/llm-d
// guides/precise-prefix-cache-aware/gaie-kv-events/values.yaml (commit
// 126f65d, inference scheduler v0.5.0) and llm-d/llm-d-inference-scheduler
// pkg/plugins/scorer/utils.go indexedScoresToNormalizedScoredPods, with the GIE scorers
// (kubernetes-sigs/gateway-api-inference-extension v1.0
// pkg/epp/scheduling/framework/plugins/scorer/{kvcache_utilization,queue}.go,
// picker/max_score_picker.go): score = 3 × precise-prefix-cache + 2 ×
// kv-cache-utilization + 2 × queue, where
//
//   - precise-prefix-cache: each pod's longest consecutive run of the
//     prompt's blocks held (llm-d-kv-cache-manager's LongestPrefixScorer over
//     the event-fed kvblock index), min-max normalised over pods (all equal:
//     1; a pod without a match: 0);
//   - kv-cache-utilization: 1 − the pod's KV cache usage (scraped metric);
//   - queue: (max − q) / (max − min) of the pods' waiting queues (all equal: 1);
//   - max-score picker: the highest total, ties broken uniformly at random.
//
// Without KV events (Learning approx) the profile's prefix scorer is the GIE
// approximate prefix-cache-scorer (v1.0 defaults: 64-token blocks, at most
// 256 blocks matched, an LRU of 31,250 blocks per server, score = matched
// blocks / prompt blocks), learned from its own decisions.
type llmdPeer struct {
	ev     bool
	tree   *approxTree
	scores []float64
}

// llm-d's default weights for the precise-prefix profile.
const (
	llmdPrefixWeight = 3
	llmdKVWeight     = 2
	llmdQueueWeight  = 2
	llmdApproxBlock  = 64 // tokens
	llmdApproxMax    = 256
	llmdApproxLRU    = 31250
)

func newLLMD(n int, ev bool) *llmdPeer {
	p := &llmdPeer{ev: ev, scores: make([]float64, n)}
	if !ev {
		p.tree = newApproxTree(n, llmdApproxBlock/16, 0, llmdApproxLRU, 0)
	}
	return p
}

func (p *llmdPeer) events() bool { return p.ev }

func (p *llmdPeer) pick(v *peerView) int {
	prefix := p.prefixScores(v)
	qmin, qmax := 1e18, -1e18
	for i := range v.workers() {
		q := v.s.workers[i].sw.Signals().Waiting
		qmin, qmax = min(qmin, q), max(qmax, q)
	}
	for i := range p.scores {
		sig := v.s.workers[i].sw.Signals()
		queue := 1.0
		if qmax > qmin {
			queue = (qmax - sig.Waiting) / (qmax - qmin)
		}
		p.scores[i] = llmdPrefixWeight*prefix[i] + llmdKVWeight*(1-sig.KVUsage) + llmdQueueWeight*queue
	}
	return argmax(p.scores, v.s.rng.IntN)
}

// prefixScores is the prefix scorer's output per pod, in [0, 1].
func (p *llmdPeer) prefixScores(v *peerView) []float64 {
	out := make([]float64, v.workers())
	if !p.ev {
		keys := v.keys[:min(len(v.keys), llmdApproxMax*p.tree.gran)]
		total := p.tree.blocks(keys)
		for i, n := range p.tree.match(keys, v.now) {
			if total > 0 {
				out[i] = float64(n) / float64(total)
			}
		}
		return out
	}
	return minMaxMatched(v.eventMatch())
}

// minMaxMatched is llm-d's normalisation of the longest-prefix scores: pods
// with a match min-max normalised to [0, 1] (all equal: 1), pods without 0.
func minMaxMatched(blocks []int) []float64 {
	out := make([]float64, len(blocks))
	lo, hi := -1, -1
	for _, b := range blocks {
		if b == 0 {
			continue
		}
		if lo < 0 || b < lo {
			lo = b
		}
		hi = max(hi, b)
	}
	for i, b := range blocks {
		switch {
		case b == 0:
		case hi == lo:
			out[i] = 1
		default:
			out[i] = float64(b-lo) / float64(hi-lo)
		}
	}
	return out
}

func (p *llmdPeer) routed(v *peerView, w int) {
	if p.tree != nil {
		p.tree.store(w, v.keys[:min(len(v.keys), llmdApproxMax*p.tree.gran)], v.now)
	}
}
