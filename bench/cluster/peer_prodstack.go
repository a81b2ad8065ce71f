package cluster

// vLLM production-stack's prefixaware router, read from
// vllm-project/production-stack src/vllm_router/routers/routing_logic.py
// (PrefixAwareRouter) and src/vllm_router/prefix/hashtrie.py (commit 35e4ad3): the
// prompt text is hashed in 128-character chunks into a trie recording which
// endpoints were sent each chunk; the endpoints at the longest matched chunk
// (all endpoints when nothing matches) are the candidates, one is chosen
// uniformly at random, and the prompt is inserted under it. No load signal
// and no eviction. A chunk is taken here as 32 tokens (about 4 characters per
// token).
type prodstackPeer struct {
	tree  *approxTree
	cands []int
}

const prodstackChunkTokens = 32

func newProdStack(n int) *prodstackPeer {
	return &prodstackPeer{tree: newApproxTree(n, prodstackChunkTokens/16, 0, 0, 0)}
}

func (p *prodstackPeer) events() bool { return false }

func (p *prodstackPeer) pick(v *peerView) int {
	lens := p.tree.match(v.keys, v.now)
	best := 0
	for _, n := range lens {
		best = max(best, n)
	}
	p.cands = p.cands[:0]
	for i, n := range lens {
		if n == best {
			p.cands = append(p.cands, i)
		}
	}
	return p.cands[v.s.rng.IntN(len(p.cands))]
}

func (p *prodstackPeer) routed(v *peerView, w int) { p.tree.store(w, v.keys, v.now) }
