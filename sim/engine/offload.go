package engine

import (
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/u64map"
)

// lruTier is an offloading tier below the GPU: a fixed number of block slots in
// LRU order. The CPU tier models vLLM's native KV offloading (--kv-offloading-backend
// native, the OffloadingConnector): every block cached on the GPU is also written to
// CPU memory, and a prompt whose GPU prefix hit ends can continue its hit from there,
// paying a transfer instead of a recompute. The disk tier models oasis-kvcached's SSD
// tier behind LMCache: every block is also spilled to disk, a hit continues from disk
// at disk bandwidth, and a block read from disk is written back to CPU memory (a
// promotion). Stores and evictions are KV events with medium "CPU" or "DISK".
type lruTier struct {
	hashes   []uint64 // by slot
	capacity int
	order    indexList          // slots in LRU order, head evicted first
	index    *u64map.Map[int32] // hash → slot + 1 (0 is empty)
	free     []int32
}

func newLRUTier(capacity int) *lruTier {
	return &lruTier{capacity: capacity, order: newIndexList(), index: u64map.New[int32]()}
}

func (c *lruTier) has(h uint64) bool {
	_, ok := c.index.Get(h)
	return ok
}

// touch marks h most recently used; false if absent.
func (c *lruTier) touch(h uint64) bool {
	i, ok := c.index.Get(h)
	i--
	if ok {
		c.order.unlink(i)
		c.order.pushTail(i)
	}
	return ok
}

// store writes h, evicting the least recently used block when full. It returns the
// evicted hash, if any, and whether h was newly stored.
func (c *lruTier) store(h uint64) (evicted uint64, didEvict, stored bool) {
	if c.touch(h) {
		return 0, false, false
	}
	var i int32
	switch {
	case len(c.free) > 0:
		i = c.free[len(c.free)-1]
		c.free = c.free[:len(c.free)-1]
	case len(c.hashes) < c.capacity:
		c.hashes = append(c.hashes, 0)
		c.order.grow()
		i = int32(len(c.hashes) - 1)
	default:
		i = c.order.head
		c.order.unlink(i)
		evicted, didEvict = c.hashes[i], true
		c.index.Delete(evicted)
	}
	c.hashes[i] = h
	c.index.Put(h, i+1)
	c.order.pushTail(i)
	return evicted, didEvict, true
}

func (c *lruTier) len() int { return c.index.Len() }

// appendRemoved adds h to a trailing BlockRemoved of the same medium or starts one.
func appendRemoved(events []kvevents.Event, h uint64, medium string) []kvevents.Event {
	if n := len(events); n > 0 {
		if r, ok := events[n-1].(kvevents.BlockRemoved); ok && r.Medium == medium {
			r.BlockHashes = append(r.BlockHashes, kvevents.HashUint64(h))
			events[n-1] = r
			return events
		}
	}
	return append(events, kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashUint64(h)}, Medium: medium})
}
