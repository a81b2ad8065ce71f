package cluster

// SGLang router's cache_aware policy, read from sgl-project/sglang
// sgl-router/src/policies/cache_aware.rs and src/tree.rs, defaults from
// sgl-router's CLI (v0.2.x: cache_threshold 0.3, balance_abs_threshold 64,
// balance_rel_threshold 1.5, eviction_interval 120 s, max_tree_size 2^26):
//
//   - loads are the router's requests in flight per worker; the system is
//     imbalanced when max − min > balance_abs_threshold and
//     max > balance_rel_threshold × min: then the least loaded worker;
//   - otherwise the prompt is matched in an approximate radix tree of the
//     prompts the router sent to each worker (a multi-tenant tree): match
//     rate = matched / prompt length; above cache_threshold the matched
//     tenant, else the tenant with the smallest tree (least cached text);
//   - either way the prompt is inserted under the chosen worker.
//
// Here the tree is over the simulator's 16-token block digests (SGLang's is
// over characters) and a matched prefix's tenant is its most recent holder
// (SGLang takes one of the deepest node's tenants). Tree eviction
// (max_tree_size per tenant, 2^26 characters) never triggers on these traces:
// a tenant's distinct prompt text stays below it, so none is modelled.
type sglangPeer struct {
	tree *approxTree
}

// SGLang router defaults.
const (
	sglangCacheThreshold = 0.3
	sglangBalanceAbs     = 64
	sglangBalanceRel     = 1.5
)

func newSGLang(n int) *sglangPeer { return &sglangPeer{tree: newApproxTree(n, 1, 0, 0, 0)} }

func (p *sglangPeer) events() bool { return false }

func (p *sglangPeer) pick(v *peerView) int {
	if sglangImbalanced(v) {
		return leastInFlight(v)
	}
	lens := p.tree.match(v.keys, v.now)
	best := -1
	for i, n := range lens {
		if n > 0 && (best < 0 || n > lens[best]) {
			best = i
		}
	}
	if best >= 0 && v.input > 0 {
		matched := float64(lens[best]*16) / float64(v.input)
		if matched > sglangCacheThreshold {
			return p.recentHolder(v.keys, lens, lens[best])
		}
	}
	return p.smallestTenant()
}

// sglangImbalanced is SGLang's switch to shortest-queue routing.
func sglangImbalanced(v *peerView) bool {
	lo, hi := v.inFlight(0), v.inFlight(0)
	for i := 1; i < v.workers(); i++ {
		lo, hi = min(lo, v.inFlight(i)), max(hi, v.inFlight(i))
	}
	return hi-lo > sglangBalanceAbs && float64(hi) > sglangBalanceRel*float64(lo)
}

// recentHolder is the worker holding the matched prefix of length n that
// stored it last.
func (p *sglangPeer) recentHolder(keys []uint64, lens []int, n int) int {
	best, bt := -1, int64(-1)
	for _, h := range p.tree.m[p.tree.key(keys, n-1)].holders {
		if lens[h.w] == n && h.t > bt {
			best, bt = int(h.w), h.t
		}
	}
	return best
}

// smallestTenant is the worker with the least text in the tree.
func (p *sglangPeer) smallestTenant() int {
	best := 0
	for i, s := range p.tree.size {
		if s < p.tree.size[best] {
			best = i
		}
	}
	return best
}

func (p *sglangPeer) routed(v *peerView, w int) { p.tree.store(w, v.keys, v.now) }
