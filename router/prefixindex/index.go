// Package prefixindex records which workers hold which KV-cache blocks, and in
// which tier, and answers "how long a prefix of this request does each worker
// already hold" fast enough to run on every routing decision.
//
// Keys are 64-bit block digests (the first 8 bytes of the chained BLAKE3
// digests of internal/blockdigest). Because digest i covers blocks 0..i, a
// match of digest i at position i implies the whole prefix up to i: the same
// block content at another position never matches.
//
// Layout, chosen for memory (≤ 64 bytes per (block, worker) entry) and read
// latency:
//   - every (block, worker) pair is one 32-byte node in a chunked slab,
//     addressed by a uint32 index;
//   - an open-addressing hash table (linear probing, load ≤ 0.8) of digest
//     and first-holder node index, 12 bytes per slot in two parallel arrays,
//     finds a digest without touching any node; the other holders of the
//     same digest are chained through the nodes;
//   - each worker keeps its nodes on an intrusive LRU list, which bounds its
//     memory (per-worker capacity) and lets TTL expiry sweep from the tail.
//
// Match looks positions up in batches (independent loads whose cache misses
// overlap) before walking them in order; on this project's VM a dependent
// memory access costs ~190 ns, an overlapped one ~16 ns.
//
// Concurrency: one RWMutex. Matches take the read lock, so any number of
// routing decisions run in parallel; writers (event batches) hold the write
// lock for one batch at a time.
package prefixindex

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
)

// Tier is where a worker holds a block. A worker can hold the same block in
// several tiers at once (GPU and a CPU offload copy), so tiers are bit flags.
type Tier uint8

const (
	TierGPU Tier = 1 << iota
	TierCPU
	TierDisk
	// TierPeer marks blocks the worker can fetch from a peer cache (for
	// example a node-local kvcached) rather than hold itself.
	TierPeer

	allTiers = TierGPU | TierCPU | TierDisk | TierPeer
	numTiers = 4
)

// String names the tiers set in t.
func (t Tier) String() string {
	names := [...]string{"GPU", "CPU", "DISK", "PEER"}
	s := ""
	for i := 0; i < numTiers; i++ {
		if t&(1<<i) != 0 {
			if s != "" {
				s += "|"
			}
			s += names[i]
		}
	}
	if s == "" {
		return "none"
	}
	return s
}

// TierWeights gives how much one matched block is worth per tier. A block
// held in several tiers counts with the best of them.
type TierWeights struct {
	GPU, CPU, Disk, Peer float64
}

// DefaultTierWeights are the weights the issue and peers (Dynamo, llm-d) use.
func DefaultTierWeights() TierWeights {
	return TierWeights{GPU: 1.0, CPU: 0.75, Disk: 0.25, Peer: 0.5}
}

// table returns, for each combination of tier bits, the best weight.
func (w TierWeights) table() [16]float32 {
	var t [16]float32
	per := [numTiers]float64{w.GPU, w.CPU, w.Disk, w.Peer}
	for mask := 1; mask < 16; mask++ {
		best := 0.0
		for i := 0; i < numTiers; i++ {
			if mask&(1<<i) != 0 && per[i] > best {
				best = per[i]
			}
		}
		t[mask] = float32(best)
	}
	return t
}

// Config sizes an index.
type Config struct {
	// DefaultCapacity bounds each worker's entries unless AddWorker gives
	// another bound. Zero means 1<<20 blocks.
	DefaultCapacity int
	// TTL, when positive, makes entries not refreshed for this long invisible
	// to Match and reclaimable. Used for approximate (decision-learned) state.
	TTL int64
}

const defaultCapacity = 1 << 20

// ErrUnknownWorker is returned for operations on a worker never added.
var ErrUnknownWorker = errors.New("prefixindex: unknown worker")

const (
	nilNode   = 0
	chunkBits = 14
	chunkSize = 1 << chunkBits
	maxSlots  = 1<<16 - 1
)

// node is one (block, worker) entry. 32 bytes.
type node struct {
	digest uint64
	prev   uint32 // LRU list of the worker: towards most recent
	next   uint32 // towards least recent; free-list link when free
	holder uint32 // next node holding the same digest
	stamp  uint32 // last store, caller's clock in ms (wraps; compared by difference)
	wide   uint32 // on a digest's first holder: its holder bitsets, or 0
	slot   uint16 // worker slot
	tiers  Tier
	_      uint8
}

// A digest held by many workers (a shared system prompt) would make Match walk
// a long holder chain at every request. Past wideAt holders the first holder
// also points at a "wide" record: one bitset of worker slots per tier, so
// Match handles such a position with a few word operations.
const wideAt = 4

func msOf(ns int64) uint32 { return uint32(ns / 1e6) }

type worker struct {
	id       string
	slot     uint16
	capacity int
	count    int
	head     uint32 // most recently stored
	tail     uint32 // least recently stored
}

// Index is the prefix index. The zero value is not usable; call New.
type Index struct {
	cfg Config

	mu      sync.RWMutex
	chunks  []*[chunkSize]node
	free    uint32   // free-list head
	used    int      // live nodes
	hwm     uint32   // next never-used node index
	table   []uint32 // first holder's node per slot
	keys    []uint64 // digest per slot, so probing touches no node
	shift   uint8    // 64 - log2(len(table))
	digests int      // live distinct digests (table occupancy)

	// Wide records: record r's tier t bitset is
	// wide[(r*numTiers+t)*words : ...+words]. Record 0 is unused.
	wide      []uint64
	words     int // uint64 words per bitset
	wideFree  []uint32
	wideCount uint32 // records ever allocated, including 0

	byID    map[string]*worker
	bySlot  []*worker // index = slot; nil for a free slot
	scratch sync.Pool // *matchScratch
}

// New returns an empty index.
func New(cfg Config) *Index {
	if cfg.DefaultCapacity <= 0 {
		cfg.DefaultCapacity = defaultCapacity
	}
	ix := &Index{
		cfg:  cfg,
		byID: make(map[string]*worker),
		hwm:  1, // index 0 is nilNode
	}
	ix.words = 1
	ix.wide = make([]uint64, numTiers*ix.words)
	ix.wideCount = 1
	ix.initTable(1 << 10)
	return ix
}

func (ix *Index) initTable(size int) {
	ix.table = make([]uint32, size)
	ix.keys = make([]uint64, size)
	ix.shift = uint8(64 - bits.TrailingZeros(uint(size)))
}

func (ix *Index) node(i uint32) *node {
	return &ix.chunks[i>>chunkBits][i&(chunkSize-1)]
}

func (ix *Index) home(d uint64) uint64 {
	// Fibonacci hashing: digests from BLAKE3 are uniform already, but tests and
	// other callers may use small integers.
	return (d * 0x9E3779B97F4A7C15) >> ix.shift
}

// lookup returns the table slot holding digest d's first holder, or the empty
// slot where it would go, and whether it was found.
func (ix *Index) lookup(d uint64) (uint64, bool) {
	mask := uint64(len(ix.table) - 1)
	for s := ix.home(d); ; s = (s + 1) & mask {
		n := ix.table[s]
		if n == nilNode {
			return s, false
		}
		if ix.keys[s] == d {
			return s, true
		}
	}
}

// matchBatch is how many positions Match looks up ahead.
const matchBatch = 64

// find returns digest d's first holder, or nilNode.
func (ix *Index) find(d uint64) uint32 {
	mask := uint64(len(ix.table) - 1)
	for s := ix.home(d); ; s = (s + 1) & mask {
		n := ix.table[s]
		if n == nilNode || ix.keys[s] == d {
			return n
		}
	}
}

// deleteSlot removes table slot s with backward-shift deletion, keeping
// linear-probing chains intact without tombstones.
func (ix *Index) deleteSlot(s uint64) {
	mask := uint64(len(ix.table) - 1)
	for {
		ix.table[s], ix.keys[s] = nilNode, 0
		j := s
		for {
			j = (j + 1) & mask
			n := ix.table[j]
			if n == nilNode {
				ix.digests--
				return
			}
			h := ix.home(ix.keys[j])
			// Move n back into s when its home is not in (s, j].
			if (j > s && (h <= s || h > j)) || (j < s && (h <= s && h > j)) {
				ix.table[s], ix.keys[s] = n, ix.keys[j]
				s = j
				break
			}
		}
	}
}

func (ix *Index) growTable() {
	old, oldKeys := ix.table, ix.keys
	ix.initTable(len(old) * 2)
	mask := uint64(len(ix.table) - 1)
	for j, n := range old {
		if n == nilNode {
			continue
		}
		s := ix.home(oldKeys[j])
		for ix.table[s] != nilNode {
			s = (s + 1) & mask
		}
		ix.table[s], ix.keys[s] = n, oldKeys[j]
	}
}

func (ix *Index) alloc() uint32 {
	if ix.free != nilNode {
		i := ix.free
		ix.free = ix.node(i).next
		*ix.node(i) = node{}
		return i
	}
	i := ix.hwm
	if int(i>>chunkBits) == len(ix.chunks) {
		ix.chunks = append(ix.chunks, new([chunkSize]node))
	}
	ix.hwm++
	return i
}

func (ix *Index) release(i uint32) {
	n := ix.node(i)
	*n = node{next: ix.free}
	ix.free = i
}

// AddWorker registers a worker with a capacity in blocks (≤ 0: the default).
// Adding a known worker only updates its capacity (evicting down to it).
func (ix *Index) AddWorker(id string, capacity int) error {
	if capacity <= 0 {
		capacity = ix.cfg.DefaultCapacity
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if w, ok := ix.byID[id]; ok {
		w.capacity = capacity
		for w.count > w.capacity {
			ix.unlink(w, w.tail)
		}
		return nil
	}
	slot := -1
	for i, w := range ix.bySlot {
		if w == nil {
			slot = i
			break
		}
	}
	if slot < 0 {
		if len(ix.bySlot) >= maxSlots {
			return fmt.Errorf("adding worker %q: index holds the maximum of %d workers", id, maxSlots)
		}
		slot = len(ix.bySlot)
		ix.bySlot = append(ix.bySlot, nil)
	}
	if slot >= ix.words*64 {
		ix.growWords(slot/64 + 1)
	}
	w := &worker{id: id, slot: uint16(slot), capacity: capacity}
	ix.bySlot[slot] = w
	ix.byID[id] = w
	return nil
}

// RemoveWorker forgets a worker and all its entries. It returns how many
// entries were dropped.
func (ix *Index) RemoveWorker(id string) int {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w, ok := ix.byID[id]
	if !ok {
		return 0
	}
	n := ix.clear(w)
	delete(ix.byID, id)
	ix.bySlot[w.slot] = nil
	return n
}

// ClearWorker drops every entry of a worker but keeps it registered: the
// resynchronisation step after an event gap, a reconnect or AllBlocksCleared.
func (ix *Index) ClearWorker(id string) (int, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w, ok := ix.byID[id]
	if !ok {
		return 0, fmt.Errorf("clearing %q: %w", id, ErrUnknownWorker)
	}
	return ix.clear(w), nil
}

func (ix *Index) clear(w *worker) int {
	n := w.count
	for w.tail != nilNode {
		ix.unlink(w, w.tail)
	}
	return n
}

// Store records that worker id holds the given digests in tier. The digests
// become the worker's most recently used entries, in order (the last one is
// the most recent, which matches how a prefix grows).
func (ix *Index) Store(id string, tier Tier, digests []uint64, now int64) error {
	if tier&allTiers == 0 || tier&^allTiers != 0 {
		return fmt.Errorf("storing blocks for %q: invalid tier %#x", id, uint8(tier))
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w, ok := ix.byID[id]
	if !ok {
		return fmt.Errorf("storing blocks for %q: %w", id, ErrUnknownWorker)
	}
	for _, d := range digests {
		ix.store(w, tier, d, now)
	}
	ix.expire(w, now)
	return nil
}

func (ix *Index) store(w *worker, tier Tier, d uint64, now int64) {
	stamp := msOf(now)
	s, found := ix.lookup(d)
	holders := 0
	if found {
		first := ix.table[s]
		for i := first; i != nilNode; {
			n := ix.node(i)
			if n.slot == w.slot {
				n.tiers |= tier
				n.stamp = stamp
				ix.touch(w, i)
				if r := ix.node(first).wide; r != 0 {
					ix.setWide(r, w.slot, n.tiers)
				}
				return
			}
			holders++
			i = n.holder
		}
	}
	// New (block, worker) entry: make room first, then look the slot up again,
	// since eviction and growth move table slots.
	if w.count >= w.capacity {
		ix.unlink(w, w.tail)
		s, found = ix.lookup(d)
	}
	if !found && (ix.digests+1)*5 > len(ix.table)*4 { // load factor 0.8
		ix.growTable()
		s, _ = ix.lookup(d)
	}
	i := ix.alloc()
	n := ix.node(i)
	n.digest, n.stamp, n.slot, n.tiers = d, stamp, w.slot, tier
	if found {
		// Chain behind the first holder: keeps the table slot unchanged.
		firstIdx := ix.table[s]
		first := ix.node(firstIdx)
		n.holder = first.holder
		first.holder = i
		if first.wide != 0 {
			ix.setWide(first.wide, w.slot, tier)
		} else if holders+1 >= wideAt {
			first.wide = ix.allocWide(firstIdx)
		}
	} else {
		ix.table[s], ix.keys[s] = i, d
		ix.digests++
	}
	ix.pushFront(w, i)
	w.count++
	ix.used++
}

// setWide makes slot's bits in wide record r equal to tiers.
func (ix *Index) setWide(r uint32, slot uint16, tiers Tier) {
	word, bit := int(slot)/64, uint64(1)<<(slot%64)
	base := int(r) * numTiers * ix.words
	for t := 0; t < numTiers; t++ {
		p := &ix.wide[base+t*ix.words+word]
		if tiers&(1<<t) != 0 {
			*p |= bit
		} else {
			*p &^= bit
		}
	}
}

// allocWide creates a wide record for the holder chain starting at first.
func (ix *Index) allocWide(first uint32) uint32 {
	var r uint32
	if k := len(ix.wideFree); k > 0 {
		r = ix.wideFree[k-1]
		ix.wideFree = ix.wideFree[:k-1]
	} else {
		r = ix.wideCount
		ix.wideCount++
		ix.wide = append(ix.wide, make([]uint64, numTiers*ix.words)...)
	}
	for i := first; i != nilNode; {
		n := ix.node(i)
		ix.setWide(r, n.slot, n.tiers)
		i = n.holder
	}
	return r
}

func (ix *Index) freeWide(r uint32) {
	base := int(r) * numTiers * ix.words
	clear(ix.wide[base : base+numTiers*ix.words])
	ix.wideFree = append(ix.wideFree, r)
}

// growWords widens every wide record's bitsets to hold words*64 slots.
func (ix *Index) growWords(words int) {
	old, ow := ix.wide, ix.words
	ix.wide = make([]uint64, int(ix.wideCount)*numTiers*words)
	for r := 0; r < int(ix.wideCount); r++ {
		for t := 0; t < numTiers; t++ {
			copy(ix.wide[(r*numTiers+t)*words:], old[(r*numTiers+t)*ow:(r*numTiers+t+1)*ow])
		}
	}
	ix.words = words
}

// Remove records that worker id no longer holds the digests in the given
// tiers (0 means every tier). Unknown digests are ignored: engines report
// removals of blocks stored before the router subscribed. When left is not
// nil it must have len(digests) elements and receives the tiers in which the
// worker still holds each digest afterwards.
func (ix *Index) Remove(id string, tier Tier, digests []uint64, left []Tier) error {
	if tier == 0 {
		tier = allTiers
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	w, ok := ix.byID[id]
	if !ok {
		return fmt.Errorf("removing blocks for %q: %w", id, ErrUnknownWorker)
	}
	if left != nil && len(left) != len(digests) {
		return fmt.Errorf("removing blocks for %q: %d digests but %d results", id, len(digests), len(left))
	}
	for k, d := range digests {
		if left != nil {
			left[k] = 0
		}
		s, found := ix.lookup(d)
		if !found {
			continue
		}
		first := ix.table[s]
		for i := first; i != nilNode; {
			n := ix.node(i)
			if n.slot == w.slot {
				n.tiers &^= tier
				if left != nil {
					left[k] = n.tiers
				}
				if n.tiers == 0 {
					ix.unlink(w, i)
				} else if r := ix.node(first).wide; r != 0 {
					ix.setWide(r, w.slot, n.tiers)
				}
				break
			}
			i = n.holder
		}
	}
	return nil
}

// Expire drops every entry older than the TTL, for all workers.
func (ix *Index) Expire(now int64) int {
	if ix.cfg.TTL <= 0 {
		return 0
	}
	ix.mu.Lock()
	defer ix.mu.Unlock()
	n := 0
	for _, w := range ix.bySlot {
		if w != nil {
			n += ix.expire(w, now)
		}
	}
	return n
}

func (ix *Index) expire(w *worker, now int64) int {
	if ix.cfg.TTL <= 0 {
		return 0
	}
	n := 0
	ttl, stamp := uint32(ix.cfg.TTL/1e6), msOf(now)
	for w.tail != nilNode && stamp-ix.node(w.tail).stamp > ttl {
		ix.unlink(w, w.tail)
		n++
	}
	return n
}

// unlink removes node i of worker w from the table chain, the LRU list, and
// frees it.
func (ix *Index) unlink(w *worker, i uint32) {
	n := ix.node(i)
	s, found := ix.lookup(n.digest)
	if found {
		first := ix.table[s]
		if r := ix.node(first).wide; r != 0 {
			ix.setWide(r, n.slot, 0)
		}
		if first == i {
			if n.holder != nilNode {
				ix.node(n.holder).wide = n.wide
				ix.table[s] = n.holder
			} else {
				if n.wide != 0 {
					ix.freeWide(n.wide)
				}
				ix.deleteSlot(s)
			}
		} else {
			for p := first; p != nilNode; {
				pn := ix.node(p)
				if pn.holder == i {
					pn.holder = n.holder
					break
				}
				p = pn.holder
			}
		}
	}
	// LRU list.
	if n.prev != nilNode {
		ix.node(n.prev).next = n.next
	} else {
		w.head = n.next
	}
	if n.next != nilNode {
		ix.node(n.next).prev = n.prev
	} else {
		w.tail = n.prev
	}
	w.count--
	ix.used--
	ix.release(i)
}

func (ix *Index) pushFront(w *worker, i uint32) {
	n := ix.node(i)
	n.prev = nilNode
	n.next = w.head
	if w.head != nilNode {
		ix.node(w.head).prev = i
	}
	w.head = i
	if w.tail == nilNode {
		w.tail = i
	}
}

func (ix *Index) touch(w *worker, i uint32) {
	if w.head == i {
		return
	}
	n := ix.node(i)
	// Detach (i is not the head, so prev is set).
	ix.node(n.prev).next = n.next
	if n.next != nilNode {
		ix.node(n.next).prev = n.prev
	} else {
		w.tail = n.prev
	}
	ix.pushFront(w, i)
}

// Match is one worker's longest held prefix of a request.
type Match struct {
	Worker string
	// Blocks is the length of the longest prefix of the request's digests the
	// worker holds (in any tier).
	Blocks int
	// Weighted sums the tier weight of each matched block.
	Weighted float64
	// GPUBlocks counts matched blocks held in GPU memory.
	GPUBlocks int
}

type matchScratch struct {
	matched []int32
	devW    []float32 // per worker: tier weight minus GPU weight, summed over non-GPU-only positions
	devGPU  []int32   // per worker: matched positions not held in GPU
	live    []uint64  // bitset: workers holding every position so far
	sink    uint64    // keeps the prefetch loads alive
	ext     []uint64  // bitset: live workers holding the current position
}

// Match appends to out, for every worker holding at least the request's first
// block, its longest held prefix. digests are the request's chained block
// digests in order. With a TTL, expired entries are dropped by the sweeps in
// Store and Expire, not here.
func (ix *Index) Match(digests []uint64, weights TierWeights, out []Match) []Match {
	if len(digests) == 0 {
		return out
	}
	wt := weights.table()
	sc, _ := ix.scratch.Get().(*matchScratch)
	if sc == nil {
		sc = &matchScratch{}
	}
	defer ix.scratch.Put(sc)

	ix.mu.RLock()
	defer ix.mu.RUnlock()
	nslots, words := len(ix.bySlot), ix.words
	if cap(sc.matched) < nslots {
		sc.matched = make([]int32, nslots)
		sc.devW = make([]float32, nslots)
		sc.devGPU = make([]int32, nslots)
	}
	if cap(sc.live) < words {
		sc.live = make([]uint64, words)
		sc.ext = make([]uint64, words)
	}
	matched, devW, devGPU := sc.matched[:nslots], sc.devW[:nslots], sc.devGPU[:nslots]
	live, ext := sc.live[:words], sc.ext[:words]
	clear(matched)
	clear(devW)
	clear(devGPU)
	wGPU := wt[TierGPU]

	// A worker extends its prefix at position pos only if it held every
	// position before: that is what makes the match a prefix, and what keeps
	// a block held at another position from counting. live is the set of
	// workers still extending.
	end := 0
	// Positions are looked up in batches before they are processed: the
	// lookups are independent, so their cache misses overlap instead of
	// queueing one after another behind the per-position work.
	var heads [matchBatch]uint32
	nh := 0
	for pos := range digests {
		if k := pos % matchBatch; k == 0 {
			nh = min(matchBatch, len(digests)-pos)
			for i := 0; i < nh; i++ {
				heads[i] = ix.find(digests[pos+i])
			}
			// Touch the batch's first-holder nodes, again independently.
			var sink uint64
			for i := 0; i < nh; i++ {
				if heads[i] != nilNode {
					n := ix.node(heads[i])
					sink += uint64(n.slot)
					if n.wide != 0 {
						sink += ix.wide[int(n.wide)*numTiers*words]
					}
				}
			}
			sc.sink = sink
		}
		head := heads[pos%matchBatch]
		if head == nilNode {
			break
		}
		clear(ext)
		extended := false
		first := ix.node(head)
		if r := first.wide; r != 0 {
			base := int(r) * numTiers * words
			gpu := ix.wide[base : base+words]
			cpu := ix.wide[base+words : base+2*words]
			disk := ix.wide[base+2*words : base+3*words]
			peer := ix.wide[base+3*words : base+4*words]
			for k := 0; k < words; k++ {
				held := gpu[k] | cpu[k] | disk[k] | peer[k]
				if pos > 0 {
					held &= live[k]
				}
				ext[k] = held
				extended = extended || held != 0
				// Positions held other than in GPU alone adjust the weights.
				for dev := held &^ (gpu[k] &^ (cpu[k] | disk[k] | peer[k])); dev != 0; dev &= dev - 1 {
					b := bits.TrailingZeros64(dev)
					slot := k*64 + b
					bit := uint64(1) << b
					var tiers Tier
					if gpu[k]&bit != 0 {
						tiers |= TierGPU
					}
					if cpu[k]&bit != 0 {
						tiers |= TierCPU
					}
					if disk[k]&bit != 0 {
						tiers |= TierDisk
					}
					if peer[k]&bit != 0 {
						tiers |= TierPeer
					}
					devW[slot] += wt[tiers] - wGPU
					if tiers&TierGPU == 0 {
						devGPU[slot]++
					}
				}
			}
		} else {
			for i := head; i != nilNode; {
				n := ix.node(i)
				i = n.holder
				word, bit := n.slot/64, uint64(1)<<(n.slot%64)
				if pos > 0 && live[word]&bit == 0 {
					continue
				}
				ext[word] |= bit
				extended = true
				if n.tiers != TierGPU {
					devW[n.slot] += wt[n.tiers&allTiers] - wGPU
					if n.tiers&TierGPU == 0 {
						devGPU[n.slot]++
					}
				}
			}
		}
		if !extended {
			break
		}
		// Workers that were live and did not extend end their prefix here.
		if pos > 0 {
			for k := 0; k < words; k++ {
				for gone := live[k] &^ ext[k]; gone != 0; gone &= gone - 1 {
					matched[k*64+bits.TrailingZeros64(gone)] = int32(pos)
				}
			}
		}
		copy(live, ext)
		end = pos + 1
	}
	if end == 0 {
		return out
	}
	for k := 0; k < words; k++ {
		for l := live[k]; l != 0; l &= l - 1 {
			matched[k*64+bits.TrailingZeros64(l)] = int32(end)
		}
	}
	for slot, m := range matched {
		if m == 0 {
			continue
		}
		out = append(out, Match{
			Worker:    ix.bySlot[slot].id,
			Blocks:    int(m),
			Weighted:  float64(m)*float64(wGPU) + float64(devW[slot]),
			GPUBlocks: int(m - devGPU[slot]),
		})
	}
	return out
}

// Stats describes an index's size.
type Stats struct {
	Workers int
	// Entries counts (block, worker) pairs; Digests distinct blocks.
	Entries, Digests int
	// Bytes estimates the index's heap footprint (slab, table, worker state).
	Bytes int64
}

// Stats returns the index's current size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	const nodeBytes = 32
	b := int64(len(ix.chunks))*chunkSize*nodeBytes + int64(len(ix.table))*12
	b += int64(len(ix.wide))*8 + int64(len(ix.bySlot))*(8+64)
	return Stats{Workers: len(ix.byID), Entries: ix.used, Digests: ix.digests, Bytes: b}
}

// Holds reports the tiers in which worker id holds digest d (0 if none).
func (ix *Index) Holds(id string, d uint64) Tier {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	w, ok := ix.byID[id]
	if !ok {
		return 0
	}
	s, found := ix.lookup(d)
	if !found {
		return 0
	}
	for i := ix.table[s]; i != nilNode; {
		n := ix.node(i)
		if n.slot == w.slot {
			return n.tiers
		}
		i = n.holder
	}
	return 0
}

// WorkerEntries returns how many entries worker id has.
func (ix *Index) WorkerEntries(id string) int {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	if w, ok := ix.byID[id]; ok {
		return w.count
	}
	return 0
}
