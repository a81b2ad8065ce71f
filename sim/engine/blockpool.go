package engine

import (
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/u64map"
)

const noBlock = -1

// block is one KV-cache block. Blocks live in a fixed array; the free queue is a
// doubly linked list over their indexes, as vLLM's FreeKVCacheBlockQueue.
type block struct {
	hash   uint64
	ref    int32
	hashed bool
	free   bool
}

// blockPool is vLLM's BlockPool: a fixed number of blocks, a free queue ordered by
// eviction priority (head evicted first), and a map from block hash to cached block.
// A block with ref 0 and a hash is both free and cached: a prefix hit revives it,
// an allocation evicts it.
//
// vLLM's queue starts as every block in id order, and freed blocks join at the tail,
// so blocks never used are always at the front. They are kept implicit (blocks grows
// on first use), so an idle engine costs almost nothing however large its cache.
type blockPool struct {
	blocks  []block // materialized blocks, ids 0..len-1
	total   int
	queue   indexList          // free queue of materialized blocks, head evicted first
	numFree int                // never-used blocks + blocks in the queue
	cached  *u64map.Map[int32] // hash → block id + 1 (0 is empty)
	events  []kvevents.Event   // pending events, drained by the engine each step
	emit    bool
}

func newBlockPool(n int, emit bool) *blockPool {
	return &blockPool{total: n, numFree: n, queue: newIndexList(), cached: u64map.New[int32](), emit: emit}
}

func (p *blockPool) pushTail(i int32) {
	p.blocks[i].free = true
	p.queue.pushTail(i)
	p.numFree++
}

func (p *blockPool) unlink(i int32) {
	p.blocks[i].free = false
	p.queue.unlink(i)
	p.numFree--
}

// lookup returns the cached block holding hash, if any.
func (p *blockPool) lookup(hash uint64) (int32, bool) {
	i, ok := p.cached.Get(hash)
	return i - 1, ok
}

// touch takes a reference on a cached block found by lookup, reviving it from the
// free queue if nobody held it.
func (p *blockPool) touch(i int32) {
	b := &p.blocks[i]
	if b.ref == 0 && b.free {
		p.unlink(i)
	}
	b.ref++
}

// allocate pops a block from the head of the free queue, evicting its cached hash.
// The caller checks numFree first.
func (p *blockPool) allocate() int32 {
	if len(p.blocks) < p.total {
		// A never-used block: ahead of every freed block in vLLM's queue.
		i := int32(len(p.blocks))
		p.blocks = append(p.blocks, block{ref: 1})
		p.queue.grow()
		p.numFree--
		return i
	}
	i := p.queue.head
	p.unlink(i)
	b := &p.blocks[i]
	if b.hashed {
		p.cached.Delete(b.hash)
		if p.emit {
			p.removed(b.hash)
		}
		b.hashed = false
	}
	b.ref = 1
	return i
}

func (p *blockPool) removed(h uint64) {
	// Consecutive evictions coalesce into one BlockRemoved, as in vLLM's step batch.
	p.events = appendRemoved(p.events, h, kvevents.MediumGPU)
}

// release drops one reference to each block, in reverse order so a request's tail
// blocks are evicted before its head blocks (vLLM's free order).
func (p *blockPool) release(ids []int32) {
	for k := len(ids) - 1; k >= 0; k-- {
		i := ids[k]
		b := &p.blocks[i]
		b.ref--
		if b.ref == 0 {
			p.pushTail(i)
		}
	}
}

// cache records block i as holding hash. It returns false, leaving the block uncached,
// when another block already holds the hash (two requests computed the same block in
// the same step); vLLM then keeps both, oasis-sim keeps the first so that a
// BlockRemoved always means the engine no longer has the block.
func (p *blockPool) cache(i int32, hash uint64) bool {
	if _, ok := p.cached.Get(hash); ok {
		return false
	}
	b := &p.blocks[i]
	b.hash, b.hashed = hash, true
	p.cached.Put(hash, i+1)
	return true
}

// reset drops every cached hash (vLLM's reset_prefix_cache). Only valid when no block
// is referenced.
func (p *blockPool) reset() bool {
	if p.numFree != p.total {
		return false
	}
	for i := range p.blocks {
		p.blocks[i].hashed = false
	}
	p.cached.Reset()
	if p.emit {
		p.events = append(p.events, kvevents.AllBlocksCleared{})
	}
	return true
}
