package cluster

// approxTree is a peer router's own approximate record of which worker holds
// which prefix, learned from its routing decisions only: a hash of each
// prefix block (the simulator's chained digests, taken every gran engine
// blocks so a peer's block of gran × 16 tokens is one key) mapped to the
// workers it sent it to and when. It is the data the peers' structures hold
// (SGLang's multi-tenant radix tree, AIBrix's prefix hash table, Dynamo's
// ApproxKvIndexer, production-stack's HashTrie, the GIE prefix scorer's
// per-server LRU); lookups walk the prompt's blocks in order, so a worker's
// match ends at its first missing block, as a tree walk does.
type approxTree struct {
	gran      int
	ttl       int64 // ns; 0: entries never expire
	workerCap int   // blocks per worker, LRU (0: unbounded)
	globalCap int   // blocks in all, LRU (0: unbounded)

	m      map[uint64]*treeEntry
	global fifo   // touches, for globalCap
	per    []fifo // per-worker touches, for workerCap
	counts []int  // blocks held per worker
	size   []int64
	lens   []int
}

type treeEntry struct {
	holders []holder
	last    int64
}

type holder struct {
	w int32
	t int64
}

type touch struct {
	k uint64
	w int32
	t int64
}

// fifo is a queue of touches; an entry is evicted when its oldest touch is
// popped and has not been refreshed since.
type fifo struct {
	q    []touch
	head int
}

func (f *fifo) push(t touch) { f.q = append(f.q, t) }
func (f *fifo) pop() (touch, bool) {
	if f.head == len(f.q) {
		return touch{}, false
	}
	t := f.q[f.head]
	f.head++
	if f.head > 4096 && f.head*2 > len(f.q) {
		f.q = append(f.q[:0], f.q[f.head:]...)
		f.head = 0
	}
	return t, true
}

func newApproxTree(workers, gran int, ttl int64, workerCap, globalCap int) *approxTree {
	t := &approxTree{gran: max(1, gran), ttl: ttl, workerCap: workerCap, globalCap: globalCap,
		m: map[uint64]*treeEntry{}, counts: make([]int, workers), size: make([]int64, workers), lens: make([]int, workers)}
	if workerCap > 0 {
		t.per = make([]fifo, workers)
	}
	return t
}

// blocks returns the peer's block keys of a prompt: every gran-th digest.
func (t *approxTree) blocks(keys []uint64) int { return len(keys) / t.gran }
func (t *approxTree) key(keys []uint64, b int) uint64 {
	return keys[(b+1)*t.gran-1]
}

// match returns, per worker, how many of the prompt's leading peer blocks
// it holds (unexpired at now). The slice is reused by the next call.
func (t *approxTree) match(keys []uint64, now int64) []int {
	clear(t.lens)
	n := t.blocks(keys)
	alive := -1 // workers still extending their match; -1: not started
	for b := 0; b < n && alive != 0; b++ {
		e := t.m[t.key(keys, b)]
		if e == nil {
			break
		}
		alive = 0
		for _, h := range e.holders {
			if t.ttl > 0 && now-h.t > t.ttl {
				continue
			}
			if t.lens[h.w] == b { // held every block so far
				t.lens[h.w] = b + 1
				alive++
			}
		}
	}
	return t.lens
}

// store records that worker w was sent the prompt's blocks at now.
func (t *approxTree) store(w int, keys []uint64, now int64) {
	for b := 0; b < t.blocks(keys); b++ {
		t.touch(w, t.key(keys, b), now)
	}
	t.evict(w)
}

func (t *approxTree) touch(w int, k uint64, now int64) {
	e := t.m[k]
	if e == nil {
		e = &treeEntry{}
		t.m[k] = e
	}
	e.last = now
	found := false
	for i := range e.holders {
		if e.holders[i].w == int32(w) {
			e.holders[i].t, found = now, true
			break
		}
	}
	if !found {
		e.holders = append(e.holders, holder{int32(w), now})
		t.counts[w]++
		t.size[w] += int64(t.gran)
	}
	switch {
	case t.workerCap > 0:
		t.per[w].push(touch{k, int32(w), now})
	case t.globalCap > 0:
		t.global.push(touch{k, int32(w), now})
	}
}

// evict drops least recently stored blocks over the capacities.
func (t *approxTree) evict(w int) {
	for t.workerCap > 0 && t.counts[w] > t.workerCap {
		x, ok := t.per[w].pop()
		if !ok {
			break
		}
		if e := t.m[x.k]; e != nil {
			t.dropHolder(e, x.k, x.w, x.t)
		}
	}
	for t.globalCap > 0 && len(t.m) > t.globalCap {
		x, ok := t.global.pop()
		if !ok {
			break
		}
		if e := t.m[x.k]; e != nil && e.last == x.t {
			for _, h := range e.holders {
				t.counts[h.w]--
				t.size[h.w] -= int64(t.gran)
			}
			delete(t.m, x.k)
		}
	}
}

// dropHolder removes worker w from entry k if its last touch was at ts.
func (t *approxTree) dropHolder(e *treeEntry, k uint64, w int32, ts int64) {
	for i, h := range e.holders {
		if h.w == w && h.t == ts {
			e.holders = append(e.holders[:i], e.holders[i+1:]...)
			t.counts[w]--
			t.size[w] -= int64(t.gran)
			if len(e.holders) == 0 {
				delete(t.m, k)
			}
			return
		}
	}
}
