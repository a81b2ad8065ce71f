package prefixindex

import "fmt"

// A worker's entries sit on intrusive LRU lists threaded through the nodes'
// prev/next links. An untiered worker (the event-fed record: engines say in
// which tier each block is) has one list. A tiered worker (the record learned
// from routing decisions, where nobody reports offloads) models an engine
// that writes its blocks through to offload tiers (LMCache, vLLM's offloading
// connector, SGLang's HiCache): its most recent Capacity.GPU entries are in
// GPU memory, the most recent Capacity.CPU in host memory, the most recent
// Capacity.Disk on disk. Each entry shows its fastest tier, so the entries
// fall in three zones of recency (GPU, then CPU only, then disk only), kept
// as three lists: a store moves at most one entry across each zone boundary,
// so spilling costs O(1) per stored block, not a walk. Concatenated, the
// zones are the worker's recency order, and the last non-empty zone's tail is
// the least recent entry overall.
const numZones = 3

// zoneTiers is the tier a tiered worker's entries show in each zone.
var zoneTiers = [numZones]Tier{TierGPU, TierCPU, TierDisk}

type zone struct {
	head     uint32 // most recently stored
	tail     uint32 // least recently stored
	count    int
	capacity int
}

// Capacity is a tiered worker's modelled cache: how many blocks each tier
// holds, as the engine is configured. The tiers are written through, so the
// CPU tier holds the GPU's most recent blocks too and the disk tier the CPU's:
// a tier no larger than the one above it adds nothing. Zero CPU or Disk: no
// such tier.
type Capacity struct {
	GPU, CPU, Disk int
}

// MaxTierBlocks bounds each tier of a Capacity: far above any engine's cache
// (2^28 blocks of 16 tokens are 4 billion tokens), low enough that no sum
// overflows.
const MaxTierBlocks = 1 << 28

// Validate reports a capacity AddTieredWorker refuses.
func (c Capacity) Validate() error {
	switch {
	case c.GPU <= 0:
		return fmt.Errorf("gpu capacity %d: want at least 1 block", c.GPU)
	case c.CPU < 0 || c.Disk < 0:
		return fmt.Errorf("capacity gpu=%d cpu=%d disk=%d: want no negative tier", c.GPU, c.CPU, c.Disk)
	case c.GPU > MaxTierBlocks || c.CPU > MaxTierBlocks || c.Disk > MaxTierBlocks:
		return fmt.Errorf("capacity gpu=%d cpu=%d disk=%d: want at most %d blocks per tier", c.GPU, c.CPU, c.Disk, MaxTierBlocks)
	}
	return nil
}

// zones is how many entries each recency zone keeps: GPU, then those only
// the CPU tier still holds, then those only the disk holds.
func (c Capacity) zones() [numZones]int {
	above := max(c.GPU, c.CPU)
	return [numZones]int{c.GPU, max(0, c.CPU-c.GPU), max(0, c.Disk-above)}
}

// AddTieredWorker registers a worker whose entries are stored in TierGPU and
// show as TierCPU, then TierDisk, as more recent ones push them out of the
// faster tiers of c, and are dropped when no tier holds them: the approximate
// record of an engine that publishes no KV events. Adding a known worker updates its
// capacity; one that was untiered loses its entries.
func (ix *Index) AddTieredWorker(id string, c Capacity) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("adding worker %q: %w", id, err)
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	return ix.addWorker(id, true, c.zones())
}

func (w *worker) setCapacities(caps [numZones]int) {
	w.capacity = 0
	for z := range w.zones {
		w.zones[z].capacity = caps[z]
		w.capacity += caps[z]
	}
}

// zoneOf is the list node n of w is on.
func (w *worker) zoneOf(n *node) int {
	if !w.tiered {
		return 0
	}
	switch n.tiers {
	case TierCPU:
		return 1
	case TierDisk:
		return 2
	}
	return 0
}

// lruTail is w's least recently stored entry (nilNode when it has none).
func (w *worker) lruTail() uint32 {
	for z := numZones - 1; z >= 0; z-- {
		if t := w.zones[z].tail; t != nilNode {
			return t
		}
	}
	return nilNode
}

func (w *worker) pushFront(ix *Index, z int, i uint32) {
	l := &w.zones[z]
	n := ix.node(i)
	n.prev = nilNode
	n.next = l.head
	if l.head != nilNode {
		ix.node(l.head).prev = i
	}
	l.head = i
	if l.tail == nilNode {
		l.tail = i
	}
	l.count++
}

func (w *worker) detach(ix *Index, z int, i uint32) {
	l := &w.zones[z]
	n := ix.node(i)
	if n.prev != nilNode {
		ix.node(n.prev).next = n.next
	} else {
		l.head = n.next
	}
	if n.next != nilNode {
		ix.node(n.next).prev = n.prev
	} else {
		l.tail = n.prev
	}
	l.count--
}

// touch makes node i, which was on zone z's list, w's most recent entry.
func (ix *Index) touch(w *worker, z int, i uint32) {
	if z == 0 && w.zones[0].head == i {
		return
	}
	w.detach(ix, z, i)
	w.pushFront(ix, 0, i)
	ix.spill(w)
}

// spill moves a tiered worker's entries past a zone's capacity to the next
// zone, least recent first, and drops what the last zone cannot hold. Stores
// keep w.count within w.capacity, so only a capacity change that shrinks the
// last zone below what the others pass down drops anything here.
func (ix *Index) spill(w *worker) {
	if !w.tiered {
		return
	}
	for z := 0; z < numZones-1; z++ {
		for w.zones[z].count > w.zones[z].capacity {
			i := w.zones[z].tail
			w.detach(ix, z, i)
			ix.retier(w, i, zoneTiers[z+1])
			w.pushFront(ix, z+1, i)
		}
	}
	for last := &w.zones[numZones-1]; last.count > last.capacity; {
		ix.unlink(w, last.tail)
	}
}

// retier sets node i's tiers and the table's summary of its digest.
func (ix *Index) retier(w *worker, i uint32, t Tier) {
	n := ix.node(i)
	n.tiers = t
	s, found := ix.lookup(n.digest())
	if !found {
		return
	}
	if sl := &ix.table[s]; sl.info&infoWide != 0 {
		ix.setWide(sl.info&infoIdx, w.slot, t)
	}
	ix.setInfo(s)
}
