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
//   - every (block, worker) pair is one 28-byte node in a chunked slab,
//     addressed by a uint32 index;
//   - an open-addressing hash table (linear probing, load ≤ 0.8) of 16-byte
//     slots: digest, first-holder node index, and what Match needs to know
//     about the holders. When one worker holds the digest (the common case:
//     most blocks of a prompt live on the worker that computed them) the slot
//     carries that worker's slot number and tiers inline, so Match resolves
//     the position with one cache miss and never touches a node; the other
//     holders of a shared digest are chained through the nodes;
//   - each worker keeps its nodes on an intrusive LRU list, which bounds its
//     memory (per-worker capacity) and lets TTL expiry sweep from the tail;
//     a tiered worker (lru.go), the record of an engine without KV events,
//     splits it in GPU, CPU and disk zones that spill into each other the way
//     the engine offloads what it evicts.
//   - an optional global budget (Config.MaxEntries, budget.go) bounds all
//     workers' entries together, evicting the least recently stored entry
//     of any worker, whatever the workers' own capacities add up to.
//
// Match looks positions up in batches (independent loads whose cache misses
// overlap) before walking them in order: a dependent memory access costs
// about ten times an overlapped one (BENCHMARKS.md has this machine's
// figures). Once one worker is
// left extending its prefix, Match checks the slab node next to that worker's
// last matched node first: the blocks of one Store sit in consecutive nodes,
// so a long match becomes a sequential walk the hardware prefetches, and a
// live node with the worker's slot and the position's digest proves the
// position as exactly as the table would. Each position is checked (no search
// over positions): a worker's holdings need not be prefix-closed, since
// capacity and TTL eviction and lost events can leave holes, and a hole must
// end that worker's match.
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

// DefaultTierWeights value a matched block by how cheaply the worker can use
// it: in its GPU 1, in its CPU memory 0.75, on its disk 0.25, at a peer 0.5.
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
	// MaxEntries, when positive, bounds the entries of all workers together,
	// whatever their own capacities add up to: a new entry past it evicts
	// the least recently stored entry of any worker (budget.go). It bounds
	// the index's memory (about 60 bytes per entry) against registrations
	// that advertise huge caches or many workers.
	MaxEntries int
	// OnBudgetEvict, when set, is told how many entries one Store evicted
	// for MaxEntries. It runs under the index's write lock: keep it short
	// (a counter).
	OnBudgetEvict func(n int)
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

// node is one (block, worker) entry. 28 bytes: the digest is two uint32
// halves so that the struct needs only 4-byte alignment.
type node struct {
	dlo, dhi uint32 // digest
	prev     uint32 // LRU list of the worker: towards most recent
	next     uint32 // towards least recent; free-list link when free
	holder   uint32 // next node holding the same digest
	stamp    uint32 // last store, caller's clock in ms (wraps; compared by difference)
	slot     uint16 // worker slot
	tiers    Tier
	_        uint8
}

func (n *node) digest() uint64 { return uint64(n.dhi)<<32 | uint64(n.dlo) }

// slot is one hash-table slot, 16 bytes: a probe touches one cache line.
type slot struct {
	key   uint64
	first uint32 // first holder's node; nilNode marks an empty slot
	info  uint32 // holders summary for Match, see infoOne and infoWide
}

// Slot info: infoOne|tiers<<16|worker slot when a single worker holds the
// digest; infoWide|record when the holders are in a wide record; 0 when
// Match must walk the holder chain from first.
const (
	infoOne  = 1 << 31
	infoWide = 1 << 30
	infoIdx  = infoWide - 1
)

// A digest held by many workers (a shared system prompt) would make Match walk
// a long holder chain at every request. From wideAt holders on, the slot
// points at a "wide" record: one bitset of worker slots per tier, so Match
// handles such a position with a few word operations. The record is kept
// until a single holder is left.
const wideAt = 4

func msOf(ns int64) uint32 { return uint32(ns / 1e6) }

type worker struct {
	id       string
	slot     uint16
	capacity int // all zones together
	count    int
	tiered   bool
	// zones are the worker's LRU lists (lru.go): an untiered worker keeps
	// every entry in zones[0]; a tiered one keeps its GPU, CPU and disk
	// entries in zones[0], [1] and [2].
	zones [numZones]zone
}

// Index is the prefix index. The zero value is not usable; call New.
type Index struct {
	cfg Config

	mu      sync.RWMutex
	chunks  []*[chunkSize]node
	free    uint32 // free-list head
	used    int    // live nodes
	hwm     uint32 // next never-used node index
	table   []slot
	shift   uint8  // 64 - log2(len(table))
	digests int    // live distinct digests (table occupancy)
	sink    uint32 // keeps warm's loads alive; written under the write lock

	// Wide records: record r's tier t bitset is
	// wide[(r*numTiers+t)*words : ...+words]. Record 0 is unused.
	wide      []uint64
	words     int // uint64 words per bitset
	wideFree  []uint32
	wideCount uint32 // records ever allocated, including 0

	byID    map[string]*worker
	bySlot  []*worker // index = slot; nil for a free slot
	scratch sync.Pool // *matchScratch

	budget budget // MaxEntries eviction (budget.go)
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
	ix.table = make([]slot, size)
	ix.shift = uint8(64 - bits.TrailingZeros(uint(size)))
}

func (ix *Index) node(i uint32) *node {
	return &ix.chunks[i>>chunkBits][i&(chunkSize-1)]
}

// home is where digest d's probe starts: the first slot of a 64-byte bucket
// (four slots), so that a digest displaced by up to three others is still in
// its home cache line. With a plain slot-granular home about one lookup in six
// at load 0.5 ran into the next line: a second, dependent miss.
func (ix *Index) home(d uint64) uint64 {
	// Fibonacci hashing: digests from BLAKE3 are uniform already, but tests and
	// other callers may use small integers.
	return (d * 0x9E3779B97F4A7C15) >> ix.shift &^ (bucketSlots - 1)
}

// bucketSlots is how many 16-byte slots share a 64-byte cache line.
const bucketSlots = 4

// lookup returns the table slot holding digest d's first holder, or the empty
// slot where it would go, and whether it was found.
func (ix *Index) lookup(d uint64) (uint64, bool) {
	mask := uint64(len(ix.table) - 1)
	for s := ix.home(d); ; s = (s + 1) & mask {
		sl := &ix.table[s]
		if sl.first == nilNode {
			return s, false
		}
		if sl.key == d {
			return s, true
		}
	}
}

// matchBatch is how many positions Match looks up ahead at first.
const matchBatch = 16

// probe looks digests up into heads (first holder, nilNode when absent) and
// infos. It is kept small and separate from Match so that its loops run in
// registers: the fewer instructions per position, the more loads the CPU
// keeps in flight. Its result only keeps the touching loads alive.
func (ix *Index) probe(digests []uint64, heads, infos []uint32, words int) uint32 {
	table, shift, mask := ix.table, ix.shift&63, uint64(len(ix.table)-1)
	heads, infos = heads[:len(digests)], infos[:len(digests)]
	// Touch the home slot of every position first: a tight loop with no
	// branch on loaded data, so that many loads are in flight at once (one
	// miss per position: a slot is 16 bytes). The lookups below then mostly
	// hit the cache.
	var sink uint32
	for _, d := range digests {
		sink += table[((d*0x9E3779B97F4A7C15)>>shift)&mask&^(bucketSlots-1)].first
	}
	for i, d := range digests {
		// The home bucket without branches on the keys (conditional moves:
		// a mispredicted branch here would cost a pipeline flush per
		// position). The earliest slot with the key wins, which is right even
		// for digest 0, whose key equals that of an empty slot: a digest
		// never sits after an empty slot of its probe sequence.
		h := ((d * 0x9E3779B97F4A7C15) >> shift) & mask &^ (bucketSlots - 1)
		b := (*[bucketSlots]slot)(table[h : h+bucketSlots])
		var f, inf uint32
		if b[3].key == d {
			f, inf = b[3].first, b[3].info
		}
		if b[2].key == d {
			f, inf = b[2].first, b[2].info
		}
		if b[1].key == d {
			f, inf = b[1].first, b[1].info
		}
		if b[0].key == d {
			f, inf = b[0].first, b[0].info
		}
		if f == nilNode && b[0].first != nilNode && b[1].first != nilNode && b[2].first != nilNode && b[3].first != nilNode {
			// A full home bucket without the digest: it may have overflowed.
			if s, found := ix.lookup(d); found {
				f, inf = table[s].first, table[s].info
			}
		}
		heads[i], infos[i] = f, inf
	}
	// Holders Match reads outside the slot (a chain's first node, a wide
	// record): touch them, again independently.
	for i, info := range infos {
		switch {
		case heads[i] == nilNode || info&infoOne != 0:
		case info&infoWide != 0:
			sink += uint32(ix.wide[int(info&infoIdx)*numTiers*words])
		default:
			sink += uint32(ix.node(heads[i]).slot)
		}
	}
	return sink
}

// setInfo recomputes slot s's holder summary after its holders or their tiers
// changed. Wide record bits are kept up to date by setWide.
func (ix *Index) setInfo(s uint64) {
	sl := &ix.table[s]
	f := ix.node(sl.first)
	if f.holder == nilNode {
		if sl.info&infoWide != 0 {
			ix.freeWide(sl.info & infoIdx)
		}
		sl.info = infoOne | uint32(f.tiers)<<16 | uint32(f.slot)
		return
	}
	if sl.info&infoWide == 0 {
		sl.info = 0
	}
}

// deleteSlot removes table slot s with backward-shift deletion, keeping
// linear-probing chains intact without tombstones.
func (ix *Index) deleteSlot(s uint64) {
	mask := uint64(len(ix.table) - 1)
	for {
		ix.table[s] = slot{}
		j := s
		for {
			j = (j + 1) & mask
			if ix.table[j].first == nilNode {
				ix.digests--
				return
			}
			h := ix.home(ix.table[j].key)
			// Move j back into s when its home is not in (s, j].
			if (j > s && (h <= s || h > j)) || (j < s && (h <= s && h > j)) {
				ix.table[s] = ix.table[j]
				s = j
				break
			}
		}
	}
}

func (ix *Index) growTable() {
	old := ix.table
	ix.initTable(len(old) * 2)
	mask := uint64(len(ix.table) - 1)
	for _, sl := range old {
		if sl.first == nilNode {
			continue
		}
		s := ix.home(sl.key)
		for ix.table[s].first != nilNode {
			s = (s + 1) & mask
		}
		ix.table[s] = sl
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
	return ix.addWorker(id, false, [numZones]int{capacity})
}

// addWorker registers worker id or updates its zone capacities. A worker that
// changes between tiered and untiered loses its entries: their tiers mean
// different things in the two.
func (ix *Index) addWorker(id string, tiered bool, caps [numZones]int) error {
	if w, ok := ix.byID[id]; ok {
		if w.tiered != tiered {
			ix.clear(w)
			w.tiered = tiered
		}
		w.setCapacities(caps)
		for w.count > w.capacity {
			ix.unlink(w, w.lruTail())
		}
		ix.spill(w)
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
	w := &worker{id: id, slot: uint16(slot), tiered: tiered}
	w.setCapacities(caps)
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
	ix.budget.forget(w)
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
	for t := w.lruTail(); t != nilNode; t = w.lruTail() {
		ix.unlink(w, t)
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
	if w.tiered && tier != TierGPU {
		return fmt.Errorf("storing blocks for %q: a tiered worker's blocks are stored in GPU and spill to lower tiers; got %s", id, tier)
	}
	ix.warm(digests)
	ix.warmEvictions(w, len(digests))
	evicted := ix.budget.evicted
	for _, d := range digests {
		ix.store(w, tier, d, now)
	}
	ix.expire(w, now)
	if n := ix.budget.evicted - evicted; n > 0 && ix.cfg.OnBudgetEvict != nil {
		ix.cfg.OnBudgetEvict(int(n))
	}
	return nil
}

// warmEvictions loads the table slots of the entries that storing n new
// blocks would evict from w's LRU tail, so that those misses overlap too.
func (ix *Index) warmEvictions(w *worker, n int) {
	var sink uint32
	for i, k := w.lruTail(), w.count+n-w.capacity; i != nilNode && k > 0; k-- {
		nd := ix.node(i)
		sink += ix.table[ix.home(nd.digest())].first
		i = nd.prev
	}
	ix.sink += sink
}

// warm loads the home buckets of digests, independently, so that the cache
// misses of a batch overlap instead of each store or removal waiting for its own.
func (ix *Index) warm(digests []uint64) {
	var sink uint32
	for _, d := range digests {
		sink += ix.table[ix.home(d)].first
	}
	ix.sink = sink
}

func (ix *Index) store(w *worker, tier Tier, d uint64, now int64) {
	stamp := msOf(now)
	s, found := ix.lookup(d)
	holders := 0
	if found {
		sl := &ix.table[s]
		for i := sl.first; i != nilNode; {
			n := ix.node(i)
			if n.slot == w.slot {
				z := w.zoneOf(n)
				n.tiers |= tier
				if w.tiered {
					n.tiers = TierGPU
				}
				n.stamp = stamp
				if sl.info&infoWide != 0 {
					ix.setWide(sl.info&infoIdx, w.slot, n.tiers)
				}
				ix.setInfo(s)
				ix.touch(w, z, i)
				return
			}
			holders++
			i = n.holder
		}
	}
	// New (block, worker) entry: make room first, then look the slot up again,
	// since eviction and growth move table slots.
	if w.count >= w.capacity {
		ix.unlink(w, w.lruTail())
		s, found = ix.lookup(d)
	} else if ix.cfg.MaxEntries > 0 && ix.used >= ix.cfg.MaxEntries {
		ix.evictOldest(w)
		s, found = ix.lookup(d)
	}
	if !found && (ix.digests+1)*5 > len(ix.table)*4 { // load factor 0.8
		ix.growTable()
		s, _ = ix.lookup(d)
	}
	i := ix.alloc()
	n := ix.node(i)
	n.dlo, n.dhi, n.stamp, n.slot, n.tiers = uint32(d), uint32(d>>32), stamp, w.slot, tier
	sl := &ix.table[s]
	if found {
		// Chain behind the first holder: keeps the table slot's first unchanged.
		first := ix.node(sl.first)
		n.holder = first.holder
		first.holder = i
		if sl.info&infoWide != 0 {
			ix.setWide(sl.info&infoIdx, w.slot, tier)
		} else if holders+1 >= wideAt {
			sl.info = infoWide | ix.allocWide(sl.first)
		}
	} else {
		sl.key, sl.first = d, i
		ix.digests++
	}
	ix.setInfo(s)
	w.pushFront(ix, 0, i)
	w.count++
	ix.used++
	ix.spill(w)
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
	ix.warm(digests)
	// With the slots in cache, load the holders' nodes ahead as well.
	var sink uint32
	for _, d := range digests {
		if s, found := ix.lookup(d); found {
			sink += ix.node(ix.table[s].first).stamp
		}
	}
	ix.sink += sink
	for k, d := range digests {
		if left != nil {
			left[k] = 0
		}
		s, found := ix.lookup(d)
		if !found {
			continue
		}
		sl := &ix.table[s]
		for i := sl.first; i != nilNode; {
			n := ix.node(i)
			if n.slot == w.slot {
				kept := n.tiers &^ tier
				if left != nil {
					left[k] = kept
				}
				if kept == 0 {
					ix.unlink(w, i) // with n.tiers intact: it names n's LRU zone
				} else {
					n.tiers = kept
					if sl.info&infoWide != 0 {
						ix.setWide(sl.info&infoIdx, w.slot, n.tiers)
					}
					ix.setInfo(s)
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
	// Stamps are milliseconds that wrap: compared by signed difference, so
	// an entry stamped after now (a concurrent caller read its clock later
	// but stored first) is young, not 49 days old.
	ttl, stamp := int32(min(ix.cfg.TTL/1e6, 1<<31-1)), msOf(now)
	for t := w.lruTail(); t != nilNode && int32(stamp-ix.node(t).stamp) > ttl; t = w.lruTail() {
		ix.unlink(w, t)
		n++
	}
	return n
}

// unlink removes node i of worker w from the table chain, the LRU list, and
// frees it.
func (ix *Index) unlink(w *worker, i uint32) {
	n := ix.node(i)
	s, found := ix.lookup(n.digest())
	if found {
		sl := &ix.table[s]
		if sl.info&infoWide != 0 {
			ix.setWide(sl.info&infoIdx, n.slot, 0)
		}
		switch {
		case sl.first != i:
			for p := sl.first; p != nilNode; {
				pn := ix.node(p)
				if pn.holder == i {
					pn.holder = n.holder
					break
				}
				p = pn.holder
			}
			ix.setInfo(s)
		case n.holder != nilNode:
			sl.first = n.holder
			ix.setInfo(s)
		default:
			if sl.info&infoWide != 0 {
				ix.freeWide(sl.info & infoIdx)
			}
			ix.deleteSlot(s)
		}
	}
	w.detach(ix, w.zoneOf(n), i)
	w.count--
	ix.used--
	ix.release(i)
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
	// Inflight counts the matched blocks, at the end of the prefix, that no
	// engine has confirmed: the router recorded them on a decision it sent
	// and the engine's KV events have not reported them yet
	// (cachestate.InflightMatcher sets it; an Index's own Match leaves 0).
	Inflight int
}

// matchScratch is one Match's working memory, pooled so that a routing
// decision allocates nothing.
type matchScratch struct {
	matched []int32   // per worker: the length of its prefix, once it ended
	devW    []float32 // per worker: tier weight minus GPU weight, summed over non-GPU-only positions
	devGPU  []int32   // per worker: matched positions not held in GPU
	live    []uint64  // bitset: workers holding every position so far
	sink    uint32    // keeps the prefetch loads alive
	heads   []uint32  // per position: first holder, nilNode when absent
	infos   []uint32  // per position: the slot's holder summary
	ext     []uint64  // bitset: live workers holding the current position
}

// prepare sizes the scratch for nslots worker slots, bitsets of words
// words and n positions, and zeroes the per-worker sums.
func (sc *matchScratch) prepare(nslots, words, n int) {
	if cap(sc.matched) < nslots {
		sc.matched = make([]int32, nslots)
		sc.devW = make([]float32, nslots)
		sc.devGPU = make([]int32, nslots)
	}
	if cap(sc.live) < words {
		sc.live = make([]uint64, words)
		sc.ext = make([]uint64, words)
	}
	if cap(sc.heads) < n {
		sc.heads = make([]uint32, n)
		sc.infos = make([]uint32, n)
	}
	sc.matched, sc.devW, sc.devGPU = sc.matched[:nslots], sc.devW[:nslots], sc.devGPU[:nslots]
	sc.live, sc.ext = sc.live[:words], sc.ext[:words]
	sc.heads, sc.infos = sc.heads[:n], sc.infos[:n]
	clear(sc.matched)
	clear(sc.devW)
	clear(sc.devGPU)
}

// tierDeviation sums, per worker, how its matched positions differ from a
// match held in GPU alone: the tier weight's difference from GPU's, and the
// positions GPU lacks.
type tierDeviation struct {
	devW   []float32
	devGPU []int32
	wt     *[16]float32
}

// add counts a matched position that worker slot holds in tiers.
func (d *tierDeviation) add(slot int, tiers Tier) {
	if tiers != TierGPU {
		d.devW[slot] += d.wt[tiers] - d.wt[TierGPU]
		if tiers&TierGPU == 0 {
			d.devGPU[slot]++
		}
	}
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
	sc.prepare(len(ix.bySlot), ix.words, len(digests))
	tally := tierDeviation{devW: sc.devW, devGPU: sc.devGPU, wt: &wt}
	end := ix.walk(sc, digests, &tally)
	if end == 0 {
		return out
	}
	return ix.appendMatches(sc, end, wt[TierGPU], out)
}

// walk follows the workers' prefixes along digests and returns the length
// of the longest (0: no worker holds the first block). It tallies every
// matched position's tiers, leaves the workers whose prefix runs to the end
// in sc.live and records where each other prefix ended in sc.matched.
//
// A worker extends its prefix at a position only if it held every position
// before: that is what makes the match a prefix, and what keeps a block held
// at another position from counting.
//
// Positions are looked up in batches ahead of the walk, so that their cache
// misses overlap instead of queueing one after another behind the
// per-position work (matchBatch of them is past what the CPU keeps in
// flight; larger batches would only waste loads past the match's end).
//
// Once a single worker is left extending (most of a long match), its next
// block is usually in the slab node next to the one it matched last: the
// blocks of one Store are allocated together. Such a node is checked
// directly, and it proves the position exactly: a live node is an entry,
// with its worker and full digest. That walk is sequential memory, which the
// hardware prefetches; only where it fails does walk go back to the table, a
// batch at a time.
func (ix *Index) walk(sc *matchScratch, digests []uint64, tally *tierDeviation) int {
	heads, infos := sc.heads, sc.infos
	end := 0
	batchEnd := 0
	solo := -1                  // the only live worker's slot, or -1
	soloNode := uint32(nilNode) // solo's node at the last position, when known
	for pos := range digests {
		if soloNode != nilNode && pos >= batchEnd {
			if n := ix.adjacent(soloNode, uint16(solo), digests[pos]); n != nilNode {
				tally.add(solo, ix.node(n).tiers)
				soloNode = n
				end = pos + 1
				continue
			}
		}
		if pos >= batchEnd {
			batchEnd = min(len(digests), pos+matchBatch)
			sc.sink += ix.probe(digests[pos:batchEnd], heads[pos:batchEnd], infos[pos:batchEnd], len(sc.live))
		}
		head, info := heads[pos], infos[pos]
		if head == nilNode {
			break
		}
		if solo >= 0 && info&infoOne != 0 && int(uint16(info)) == solo {
			// One live worker, extending alone: most of a long match.
			tally.add(solo, Tier(info>>16)&allTiers)
			soloNode = head
			end = pos + 1
			continue
		}
		// The holders that extend their prefix here, by how the slot
		// describes them.
		clear(sc.ext)
		var extended bool
		switch {
		case info&infoOne != 0:
			extended = extendOne(sc.live, sc.ext, pos, info, tally)
		case info&infoWide != 0:
			extended = ix.extendWide(sc.live, sc.ext, pos, info&infoIdx, tally)
		default:
			extended = ix.extendChain(sc.live, sc.ext, pos, head, tally)
		}
		if !extended {
			break
		}
		if pos > 0 {
			endPrefixes(sc.matched, sc.live, sc.ext, pos)
		}
		copy(sc.live, sc.ext)
		end = pos + 1
		solo, soloNode = soloSlot(sc.live), nilNode
		if solo >= 0 && info&infoOne != 0 {
			soloNode = head // the single holder is the solo worker
		}
	}
	return end
}

// extendOne sets ext to the holder of position pos if it extends its
// prefix there (at position 0, or if it is live), for the common case of a
// position with a single holder, which its slot's info describes. It tallies
// the holder's tiers and reports whether it extends.
func extendOne(live, ext []uint64, pos int, info uint32, tally *tierDeviation) bool {
	slot := uint16(info)
	word, bit := slot/64, uint64(1)<<(slot%64)
	if pos > 0 && live[word]&bit == 0 {
		return false
	}
	ext[word] = bit
	tally.add(int(slot), Tier(info>>16)&allTiers)
	return true
}

// extendWide is extendOne for a position whose holders are in wide record
// r, a bitset of worker slots per tier: ext gets every holder that extends.
func (ix *Index) extendWide(live, ext []uint64, pos int, r uint32, tally *tierDeviation) bool {
	words := len(ext)
	base := int(r) * numTiers * words
	gpu := ix.wide[base : base+words]
	cpu := ix.wide[base+words : base+2*words]
	disk := ix.wide[base+2*words : base+3*words]
	peer := ix.wide[base+3*words : base+4*words]
	extended := false
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
			tally.add(k*64+b, tiers)
		}
	}
	return extended
}

// extendChain is extendWide for a position whose holders are chained
// through their nodes from head.
func (ix *Index) extendChain(live, ext []uint64, pos int, head uint32, tally *tierDeviation) bool {
	extended := false
	for i := head; i != nilNode; {
		n := ix.node(i)
		i = n.holder
		word, bit := n.slot/64, uint64(1)<<(n.slot%64)
		if pos > 0 && live[word]&bit == 0 {
			continue
		}
		ext[word] |= bit
		extended = true
		tally.add(int(n.slot), n.tiers&allTiers)
	}
	return extended
}

// endPrefixes records that the workers in live but not in ext, which held
// every position before pos and not pos, have prefixes pos blocks long.
func endPrefixes(matched []int32, live, ext []uint64, pos int) {
	for k := range live {
		for gone := live[k] &^ ext[k]; gone != 0; gone &= gone - 1 {
			matched[k*64+bits.TrailingZeros64(gone)] = int32(pos)
		}
	}
}

// appendMatches appends to out a Match for every worker with a prefix: the
// ones walk left live hold all end positions.
func (ix *Index) appendMatches(sc *matchScratch, end int, wGPU float32, out []Match) []Match {
	for k, l := range sc.live {
		for ; l != 0; l &= l - 1 {
			sc.matched[k*64+bits.TrailingZeros64(l)] = int32(end)
		}
	}
	for slot, m := range sc.matched {
		if m == 0 {
			continue
		}
		// Filled in place: a Match built on the stack and copied in stalls on
		// store forwarding.
		out = append(out, Match{})
		r := &out[len(out)-1]
		r.Worker = ix.bySlot[slot].id
		r.Blocks = int(m)
		r.Weighted = float64(m)*float64(wGPU) + float64(sc.devW[slot])
		r.GPUBlocks = int(m - sc.devGPU[slot])
	}
	return out
}

// adjacent returns the node next to n in the slab (after it, else before it)
// if it is worker slot's live entry for digest d, else nilNode.
func (ix *Index) adjacent(n uint32, slot uint16, d uint64) uint32 {
	if c := n + 1; c < ix.hwm {
		if nd := ix.node(c); nd.tiers != 0 && nd.slot == slot && nd.digest() == d {
			return c
		}
	}
	if c := n - 1; c != nilNode {
		if nd := ix.node(c); nd.tiers != 0 && nd.slot == slot && nd.digest() == d {
			return c
		}
	}
	return nilNode
}

// soloSlot returns the slot of the only worker in set, or -1.
func soloSlot(set []uint64) int {
	n, k := 0, -1
	for i, l := range set {
		if l != 0 {
			n += bits.OnesCount64(l)
			k = i*64 + bits.TrailingZeros64(l)
		}
	}
	if n != 1 {
		return -1
	}
	return k
}

// Stats describes an index's size.
type Stats struct {
	Workers int
	// Entries counts (block, worker) pairs; Digests distinct blocks.
	Entries, Digests int
	// Bytes estimates the index's heap footprint (slab, table, worker state).
	Bytes int64
	// BudgetEvictions counts entries evicted to keep within
	// Config.MaxEntries since the index was made.
	BudgetEvictions uint64
}

// Stats returns the index's current size.
func (ix *Index) Stats() Stats {
	ix.mu.RLock()
	defer ix.mu.RUnlock()
	const nodeBytes, slotBytes = 28, 16
	b := int64(len(ix.chunks))*chunkSize*nodeBytes + int64(len(ix.table))*slotBytes
	b += int64(len(ix.wide))*8 + int64(len(ix.bySlot))*(8+64)
	return Stats{Workers: len(ix.byID), Entries: ix.used, Digests: ix.digests, Bytes: b,
		BudgetEvictions: ix.budget.evicted}
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
	for i := ix.table[s].first; i != nilNode; {
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
