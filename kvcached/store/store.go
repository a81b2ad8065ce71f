// Package store is kvcached's tiered block store: RAM (LRU, bounded by bytes)
// over an SSD tier (one file per block, index in Pebble), with a Remote (the
// QUIC peers) asked on a local miss.
//
// Every SET lands in RAM and is queued for a background write to disk
// (write-back: written within SpillDelay, skipped if superseded by then),
// so a restart or kill -9 keeps every block whose write finished (a value
// kept inline in the disk index once the index's log is synced); RAM
// eviction then only drops clean blocks, or writes a still-dirty victim
// itself, which pushes back on writers when the disk is slower than they
// are. A read from disk promotes the block to RAM.
package store

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/kvcached/internal/bufpool"
)

// Tier names where a block sits.
type Tier int

const (
	TierRAM Tier = iota
	TierDisk
	TierPeer
)

func (t Tier) String() string {
	switch t {
	case TierRAM:
		return "ram"
	case TierDisk:
		return "disk"
	case TierPeer:
		return "peer"
	}
	return "unknown"
}

// Observer learns when a block enters or leaves a local tier; the presence
// publisher implements it. Calls must not block.
type Observer interface {
	Stored(key string, tier Tier)
	Removed(key string, tier Tier)
}

// ErrNotFound is what a Remote returns when no peer holds the block.
var ErrNotFound = errors.New("block not found")

// Remote fetches blocks this node lacks (the QUIC peers).
type Remote interface {
	Fetch(ctx context.Context, key string) ([]byte, error)
	// MayHave is a cheap local check (peers' membership filters) that says
	// whether a Fetch could succeed.
	MayHave(key string) bool
}

// Config configures a Store.
type Config struct {
	RAMBytes  int64        // RAM tier limit; required
	DiskBytes int64        // disk tier limit; 0 disables the disk tier
	Dir       string       // disk tier directory; required with DiskBytes
	MaxValue  int64        // largest value accepted; default 64 MiB
	Logger    hclog.Logger // nil discards the store's logs
	// Metrics are the collectors the store updates (NewMetrics registers
	// them); nil keeps them unregistered.
	Metrics  *Metrics
	Observer Observer // optional
	Remote   Remote   // optional
	// SpillQueue bounds blocks waiting for their background disk write.
	SpillQueue int
	// SpillDelay bounds how long a block waits before its disk write
	// (default DefaultSpillDelay; it waits at least half of it); Flush does
	// not wait for it.
	SpillDelay time.Duration
	// PoolBytes bounds the buffers of values the store let go (overwritten,
	// deleted, evicted, and held by nobody else) kept for reuse by its disk
	// reads and by whoever receives values for it (BufferPool); 0 keeps none.
	PoolBytes int64
}

// SetMode is SET's condition.
type SetMode int

const (
	SetAlways SetMode = iota
	SetNX             // only if absent
	SetXX             // only if present
)

type item struct {
	key      string
	val      []byte
	expireAt int64  // unix ns; 0 = never
	seq      uint64 // write sequence, newer writes have larger ones
	dirty    bool   // not yet on disk
	// queued: a spill-queue entry will visit it. A key rewritten in a loop
	// keeps its item (overwritten in place) and so has one entry at a time.
	queued  bool
	writing bool // a disk write is in flight
	deleted bool // removed by DEL/overwrite while a write was in flight
	// pins counts Borrow loans of val not yet released; shared says val was
	// handed out without one (Get, GetLocal, a peer fetch). Either keeps val
	// from going back to the buffer pool when the item lets it go.
	pins   int32
	shared bool
	lruLinks[item]
}

func (it *item) links() *lruLinks[item] { return &it.lruLinks }

// Store is safe for concurrent use.
type Store struct {
	cfg  Config
	pool *bufpool.Pool // nil without Config.PoolBytes
	log  hclog.Logger
	m    *Metrics
	disk *diskTier // nil without a disk tier

	mu sync.Mutex
	// seq numbers writes in the order they enter RAM (taken under mu: a
	// shared atomic taken before the lock would cost a cache-line transfer
	// per SET and could order two racing SETs of a key opposite to RAM).
	seq       uint64
	ram       map[string]*item
	lru       lruList[item, *item] // under mu
	ramUsed   int64
	pubUsed   int64 // ramUsed as last published to the gauges
	pubBlocks int   // len(ram) as last published

	spill    chan spillMsg
	flushing atomic.Int32  // Flush calls in progress: the spiller skips its delay
	kick     chan struct{} // wakes a spiller waiting out a delay
	wg       sync.WaitGroup
	cancel   context.CancelFunc
	now      func() time.Time
	epoch    time.Time // monotonic origin of spillMsg.at
}

// Open opens (or creates) a store; with a disk tier it reloads what a
// previous run left there.
func Open(cfg Config) (*Store, error) {
	if cfg.RAMBytes <= 0 {
		return nil, fmt.Errorf("opening store: RAM limit %d must be positive", cfg.RAMBytes)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(prometheus.NewRegistry())
	}
	if cfg.MaxValue <= 0 {
		cfg.MaxValue = 64 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.SpillQueue <= 0 {
		cfg.SpillQueue = 16384
	}
	if cfg.SpillDelay <= 0 {
		cfg.SpillDelay = DefaultSpillDelay
	}
	s := &Store{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, ram: make(map[string]*item), now: time.Now, epoch: time.Now(),
		kick: make(chan struct{}, 1)}
	if cfg.PoolBytes > 0 {
		s.pool = bufpool.New(cfg.PoolBytes)
		cfg.Metrics.pool.Store(s.pool)
	}
	if cfg.DiskBytes > 0 {
		if cfg.Dir == "" {
			return nil, errors.New("opening store: a disk tier needs a directory")
		}
		d, maxSeq, err := openDisk(cfg.Dir, cfg.DiskBytes, cfg.Logger.Named("disk"), cfg.Metrics, cfg.Observer)
		if err != nil {
			return nil, fmt.Errorf("opening store: %w", err)
		}
		d.bufs = s.pool
		s.disk = d
		s.seq = maxSeq
		s.spill = make(chan spillMsg, cfg.SpillQueue)
		ctx, cancel := context.WithCancel(context.Background())
		s.cancel = cancel
		s.wg.Add(1)
		go s.spiller(ctx)
	}
	return s, nil
}

// Close stops the spiller after it drains and closes the disk index.
func (s *Store) Close() error {
	if s.disk == nil {
		return nil
	}
	s.cancel()
	s.wg.Wait()
	return s.disk.close()
}

// BufferPool is where values for Set are best received into (a nil pool
// allocates): the store hands back there the buffers of values it let go.
func (s *Store) BufferPool() *bufpool.Pool { return s.pool }

// MaxValue is the largest value Set accepts.
func (s *Store) MaxValue() int64 { return s.cfg.MaxValue }

// ValueTooLargeError is returned by Set for a value over MaxValue.
type ValueTooLargeError struct{ Len, Max int64 }

func (e *ValueTooLargeError) Error() string {
	return fmt.Sprintf("value of %d bytes exceeds the %d-byte limit", e.Len, e.Max)
}

func (s *Store) nowNano() int64 { return s.now().UnixNano() }

func expired(at, now int64) bool { return at != 0 && at <= now }

// removeRAMLocked takes it out of RAM. A deleted (not evicted) item still
// referenced by the spill queue gives up its value now, so queued references
// never hold memory outside the RAM limit.
func (s *Store) removeRAMLocked(it *item, deleted bool) {
	delete(s.ram, it.key)
	s.dropRAMLocked(it, deleted)
}

// dropRAMLocked is removeRAMLocked without the map deletion.
func (s *Store) dropRAMLocked(it *item, deleted bool) {
	s.lru.unlink(it)
	s.ramUsed -= int64(len(it.val))
	if deleted {
		it.deleted = true
		if !it.writing {
			s.releaseValLocked(it)
			it.dirty = false
		}
	} else if !it.dirty && !it.writing {
		// Evicted and already on disk (or never going there): nothing
		// reads its value again.
		s.releaseValLocked(it)
	}
}

// releaseValLocked drops it's value, giving its buffer to the pool when no
// loan or unpinned reader can still hold it.
func (s *Store) releaseValLocked(it *item) {
	if it.pins == 0 && !it.shared {
		s.pool.Put(it.val)
	}
	it.val = nil
}

// gaugesLocked publishes the RAM tier's size when it changed: a key
// overwritten with a value of the same size (a hot key rewritten in a loop)
// leaves it as it was, and the gauges' shared cache lines cost every SET.
func (s *Store) gaugesLocked() {
	if s.ramUsed != s.pubUsed {
		s.pubUsed = s.ramUsed
		s.m.bytesRAM.Set(float64(s.ramUsed))
	}
	if n := len(s.ram); n != s.pubBlocks {
		s.pubBlocks = n
		s.m.blocksRAM.Set(float64(n))
	}
}

// Set stores val under key. expireAt is unix nanoseconds, 0 for none. It
// reports whether the value was written (false when NX/XX failed). The store
// keeps val (it is not copied): the caller must not change it afterwards.
func (s *Store) Set(key string, val []byte, expireAt int64, mode SetMode) (bool, error) {
	if int64(len(val)) > s.cfg.MaxValue {
		s.m.TooLarge.Inc()
		return false, &ValueTooLargeError{Len: int64(len(val)), Max: s.cfg.MaxValue}
	}
	if int64(len(val)) > s.cfg.RAMBytes {
		s.m.TooLarge.Inc()
		return false, &ValueTooLargeError{Len: int64(len(val)), Max: s.cfg.RAMBytes}
	}
	if mode != SetAlways {
		exists := s.existsLocal(key)
		if (mode == SetNX && exists) || (mode == SetXX && !exists) {
			return false, nil
		}
	}
	s.insert(key, nil, val, expireAt, true, false)
	return true, nil
}

// SetKey is Set (unconditional, no expiry) with the key as bytes: the key
// string is allocated only when the key is new, and an overwrite reuses the
// stored one (Redis clients rewrite the same keys, and a conversion per SET
// shows in kvcached's CPU under pipelined 1 KiB SETs). key is not retained.
func (s *Store) SetKey(key []byte, val []byte) error {
	if int64(len(val)) > s.cfg.MaxValue || int64(len(val)) > s.cfg.RAMBytes {
		_, err := s.Set(string(key), val, 0, SetAlways)
		return err
	}
	s.insert("", key, val, 0, true, false)
	return nil
}

// insert puts a value in RAM under key, or under kb when kb is not nil;
// dirty values are queued for disk. shared says the caller hands val out
// too, so the store must never recycle its buffer.
func (s *Store) insert(key string, kb []byte, val []byte, expireAt int64, dirty, shared bool) {
	dirty = dirty && s.disk != nil
	send := false
	var spare []byte // the overwritten value's buffer, for the pool
	s.mu.Lock()
	s.seq++
	var old *item
	if kb != nil {
		old = s.ram[string(kb)]
	} else {
		old = s.ram[key]
	}
	var it *item
	if old != nil && !old.writing {
		// Overwritten in place: the item is not being written (which reads
		// its value and marks it clean afterwards), and nothing else holds
		// it but the map, the LRU list and the spill queue, which look at
		// its value and seq under the lock. A key rewritten in a loop then
		// costs no allocation of an item, no map write and, while its
		// spill entry waits, no new entry: the entry finds the newer seq
		// and waits again.
		it = old
		s.lru.unlink(it)
		s.ramUsed += int64(len(val)) - int64(len(it.val))
		if len(it.val) >= bufpool.MinSize && it.pins == 0 && !it.shared {
			spare = it.val
		}
		it.val, it.expireAt, it.seq = val, expireAt, s.seq
		it.pins, it.shared = 0, shared
		it.dirty = dirty
		if dirty && !it.queued {
			it.queued = true
			send = true
		}
	} else {
		if kb != nil {
			if old != nil {
				key = old.key
			} else {
				key = string(kb)
			}
		}
		it = &item{key: key, val: val, expireAt: expireAt, seq: s.seq, dirty: dirty, shared: shared}
		if dirty {
			// Marked queued before it is visible: Flush counts it as pending.
			it.queued = true
			send = true
		}
		if old != nil {
			// Being written: replaced by a new item. The map entry is
			// overwritten below rather than deleted first.
			s.dropRAMLocked(old, true)
		}
		s.ram[key] = it
		s.ramUsed += int64(len(val))
	}
	key, seq := it.key, it.seq
	s.lru.pushFront(it)
	victims := s.evictLocked()
	s.gaugesLocked()
	s.mu.Unlock()
	if spare != nil {
		s.pool.Put(spare)
	}
	if send {
		// Sent once the lock is released (the send is most of the hold
		// time otherwise).
		select {
		case s.spill <- spillMsg{it: it, seq: seq, at: time.Since(s.epoch)}:
		default:
			// Queue full: the block (with any value written over it in
			// place meanwhile) stays dirty and is written when evicted
			// (or queued by Flush).
			s.mu.Lock()
			it.queued = false
			s.mu.Unlock()
		}
	}
	if old == nil && s.cfg.Observer != nil {
		s.cfg.Observer.Stored(key, TierRAM)
	}
	s.writeVictims(victims)
}

// evictLocked removes LRU blocks until RAM is within its limit and returns
// the dirty ones that still need a disk write.
func (s *Store) evictLocked() []*item {
	var victims []*item
	for s.ramUsed > s.cfg.RAMBytes && s.lru.tail != nil {
		v := s.lru.tail
		s.removeRAMLocked(v, false)
		s.m.evictRAM.Inc()
		if v.dirty && !v.writing {
			// Written now by the evicting caller (the spiller skips it
			// later), so the value's memory is released promptly.
			v.writing = true
			victims = append(victims, v)
		}
		if s.cfg.Observer != nil {
			s.cfg.Observer.Removed(v.key, TierRAM)
		}
	}
	return victims
}

func (s *Store) writeVictims(victims []*item) {
	for _, v := range victims {
		s.writeBack(v)
	}
}

// writeBack writes one dirty item to disk; the caller set it.writing.
func (s *Store) writeBack(it *item) {
	s.mu.Lock()
	val, expireAt, seq, key := it.val, it.expireAt, it.seq, it.key
	s.mu.Unlock()
	var err error
	if s.disk == nil || !s.disk.writable() {
		err = errors.New("disk tier unavailable")
		s.m.SpillSkipped.Inc()
	} else if err = s.disk.put(key, val, expireAt, seq); err != nil {
		s.disk.setDegraded(err)
		s.m.SpillSkipped.Inc()
	} else {
		s.disk.setHealthy()
		s.m.Spills.Inc()
		s.m.SpillBytes.Add(float64(len(val)))
	}
	s.mu.Lock()
	it.writing = false
	it.dirty = false // written, or given up on: never retried
	deleted := it.deleted
	if deleted || s.ram[key] != it {
		s.releaseValLocked(it)
	}
	s.mu.Unlock()
	if err != nil && s.disk != nil {
		// An older copy on disk must not resurface once RAM drops this one.
		s.disk.delOlder(key, seq)
	}
	if deleted && err == nil {
		// DEL or an overwrite raced with this write: take back exactly it.
		s.disk.del(key, seq)
	}
}

// DefaultSpillDelay bounds how long a block waits in RAM before the spiller
// writes it (write-back coalescing): the spiller looks at a queued key every
// half delay and writes its value once no newer one replaced it over a whole
// half delay, so a block overwritten or deleted within half the delay is
// never written (what a hot key rewritten in a loop costs), every block is
// written between half the delay and the delay after its SET when the disk
// keeps up, and the spiller wakes once per batch of blocks rather than once
// per SET. It bounds what a kill -9 can lose beyond the blocks being
// written: blocks acknowledged within the last DefaultSpillDelay, and for
// values kept inline in the disk index walSyncDelay more.
const DefaultSpillDelay = 5 * time.Millisecond

// spillEntry is a spill-queue entry as the spiller holds it.
type spillEntry struct {
	it       *item         // the item to write
	deadline time.Duration // since s.epoch: when to write
	seen     uint64        // seq of the value the deadline was set for
}

// spiller writes queued blocks in queue order, each once its key has gone
// half of SpillDelay without a newer value (at once while a Flush waits);
// blocks superseded or deleted by then are dropped without touching the
// disk.
//
// An item overwritten in place while its entry waited (insert) restarts the
// entry's half delay when the spiller reaches it: the entry goes to the back
// of the spiller's list with a fresh deadline, so a key rewritten in a loop
// is written once per pause in its writes, and a value is written at most a
// whole delay after its SET (it arrived within the half delay before the
// spiller noticed it, and waits one more).
func (s *Store) spiller(ctx context.Context) {
	defer s.wg.Done()
	// The spiller is not given a lower OS priority (a nice 19 thread): it
	// takes the store's and the disk index's locks, and a request waiting on
	// a lock held by a starved low-priority thread waits for the scheduler
	// (priority inversion). It costs requests CPU only when it has work.
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	var pending []spillEntry // FIFO; pending[head:] are waiting
	head := 0
	for {
		if head == len(pending) {
			pending, head = pending[:0], 0
			select {
			case m := <-s.spill:
				pending = append(pending, s.newEntry(m))
			case <-ctx.Done():
				s.drainSpill(nil)
				return
			}
		}
		// Take what else is queued too, a bounded batch at a time.
	fill:
		for n := 0; n < spillBatch; n++ {
			select {
			case m := <-s.spill:
				pending = append(pending, s.newEntry(m))
			default:
				break fill
			}
		}
		e := pending[head]
		pending[head] = spillEntry{}
		head++
		if head > 1024 && head*2 > len(pending) {
			pending, head = append(pending[:0], pending[head:]...), 0
		}
		if wait := e.deadline - time.Since(s.epoch); wait > 0 && s.flushing.Load() == 0 && s.live(e.it) {
			timer.Reset(wait)
			select {
			case <-timer.C:
			case <-s.kick:
				timer.Stop()
			case <-ctx.Done():
				timer.Stop()
				s.drainSpill(append(pending[head:], e))
				return
			}
		}
		if again, ok := s.writeEntry(e); !ok {
			pending = append(pending, again)
		}
	}
}

// spillBatch is how many queued blocks the spiller takes from the channel
// at a time.
const spillBatch = 256

// spillMsg is a spill-queue entry as sent: the item, its seq then (an item
// overwritten in place changes it), and when it was sent.
type spillMsg struct {
	it  *item
	seq uint64
	at  time.Duration // since s.epoch
}

func (s *Store) newEntry(m spillMsg) spillEntry {
	return spillEntry{it: m.it, deadline: m.at + s.cfg.SpillDelay/2, seen: m.seq}
}

// live reports whether it still has a block to write, so the
// spiller need not wait out the delay to drop it.
func (s *Store) live(it *item) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return it.dirty && !it.deleted && !it.writing
}

// writeEntry writes e's block, or drops the entry when there is nothing to
// write. When the item was overwritten in place after the entry's deadline
// was set, and no Flush is waiting, it writes nothing and returns the entry
// with a fresh deadline (ok false) for the back of the spiller's list.
func (s *Store) writeEntry(e spillEntry) (again spillEntry, ok bool) {
	s.mu.Lock()
	t := e.it
	if !t.dirty || t.deleted || t.writing {
		// Superseded (replaced while being written), deleted, or written
		// by an evicting request: nothing to write.
		t.queued = false
		s.mu.Unlock()
		return spillEntry{}, true
	}
	if t.seq != e.seen && s.flushing.Load() == 0 {
		e.seen = t.seq // read under the lock: a SET may be rewriting it
		s.mu.Unlock()
		e.deadline = time.Since(s.epoch) + s.cfg.SpillDelay/2
		return e, false
	}
	t.queued, t.writing = false, true
	s.mu.Unlock()
	s.writeBack(t)
	return spillEntry{}, true
}

// drainSpill writes, without delay, every block the spiller holds (rest)
// and every one still in the channel: a clean shutdown loses nothing.
func (s *Store) drainSpill(rest []spillEntry) {
	s.flushing.Add(1)
	defer s.flushing.Add(-1)
	for _, e := range rest {
		s.writeEntry(e)
	}
	for {
		select {
		case m := <-s.spill:
			s.writeEntry(s.newEntry(m))
		default:
			return
		}
	}
}

// Flush waits until every dirty block has been written (queueing those a
// full queue left out); for tests and graceful shutdown.
func (s *Store) Flush(ctx context.Context) error {
	if s.disk == nil {
		return nil
	}
	s.flushing.Add(1)
	defer s.flushing.Add(-1)
	select {
	case s.kick <- struct{}{}:
	default:
	}
	for {
		s.mu.Lock()
		pending := 0
		for _, it := range s.ram {
			if !it.dirty {
				continue
			}
			pending++
			if !it.queued && !it.writing {
				// Left out when the queue was full: queue it now.
				select {
				case s.spill <- spillMsg{it: it, seq: it.seq, at: time.Since(s.epoch)}:
					it.queued = true
				default:
				}
			}
		}
		s.mu.Unlock()
		if pending == 0 && len(s.spill) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// Get returns the value of key from the fastest tier that holds it, asking
// the Remote on a local miss. The returned slice must not be modified; the
// store never reuses its memory (Borrow lends a value it may reuse later).
func (s *Store) Get(ctx context.Context, key string) ([]byte, Tier, bool) {
	v, _, tier, ok := s.get(ctx, key, false)
	return v, tier, ok
}

// A Loan is a value lent by Borrow. Its bytes stay valid and unchanged, even
// if the key is overwritten or deleted meanwhile, until the loan is given to
// Release; after that the store may reuse them for another value.
type Loan struct {
	it  *item // nil: nothing to give back
	seq uint64
}

// Borrow is Get for a caller that is done with the value soon (a reply
// written to a socket) and says so with Release, so that the value's buffer
// can be reused once the key lets it go. A loan never released only costs
// the reuse.
func (s *Store) Borrow(ctx context.Context, key string) ([]byte, Loan, Tier, bool) {
	return s.get(ctx, key, true)
}

// Release gives back a loan from Borrow; the zero Loan is ignored.
func (s *Store) Release(l Loan) {
	if l.it == nil {
		return
	}
	s.mu.Lock()
	// A value overwritten in place since has a new seq and pins of its own;
	// the lent one was not recycled (it was pinned) and needs nothing.
	if l.it.seq == l.seq && l.it.pins > 0 {
		l.it.pins--
	}
	s.mu.Unlock()
}

func (s *Store) get(ctx context.Context, key string, pin bool) ([]byte, Loan, Tier, bool) {
	if v, loan, tier, ok := s.getLocal(key, true, pin); ok {
		s.m.hit(tier)
		return v, loan, tier, true
	}
	if v, ok := s.fetchRemote(ctx, key); ok {
		s.m.hitPeer.Inc()
		return v, Loan{}, TierPeer, true
	}
	s.m.Misses.Inc()
	return nil, Loan{}, 0, false
}

// GetLocal reads RAM and disk only, without promotion: what peers are served.
func (s *Store) GetLocal(key string) ([]byte, bool) {
	v, _, _, ok := s.getLocal(key, false, false)
	return v, ok
}

// ReadCost is how many bytes GetLocal(key) allocates: the block's size when
// only the disk tier holds it, else 0 (RAM values are shared, not copied).
func (s *Store) ReadCost(key string) int64 {
	s.mu.Lock()
	_, inRAM := s.ram[key]
	s.mu.Unlock()
	if inRAM || s.disk == nil {
		return 0
	}
	return s.disk.size(key)
}

// getLocal reads key from RAM or disk, promoting a disk hit when promote is
// set. With pin the value is lent (see Borrow), else it is marked shared.
func (s *Store) getLocal(key string, promote, pin bool) ([]byte, Loan, Tier, bool) {
	now := s.nowNano()
	s.mu.Lock()
	if it, ok := s.ram[key]; ok {
		if !expired(it.expireAt, now) {
			s.lru.unlink(it)
			s.lru.pushFront(it)
			v, loan := it.val, s.lendLocked(it, pin)
			s.mu.Unlock()
			return v, loan, TierRAM, true
		}
		s.removeRAMLocked(it, true)
		s.gaugesLocked()
		s.mu.Unlock()
		if s.disk != nil {
			s.disk.del(key, 0)
		}
		if s.cfg.Observer != nil {
			s.cfg.Observer.Removed(key, TierRAM)
		}
		return nil, Loan{}, 0, false
	}
	s.mu.Unlock()
	if s.disk == nil {
		return nil, Loan{}, 0, false
	}
	v, expireAt, ok, _ := s.disk.get(key, now)
	if !ok {
		return nil, Loan{}, 0, false
	}
	var loan Loan
	if promote {
		s.m.Promotions.Inc()
		loan = s.insertClean(key, v, expireAt, pin)
	}
	return v, loan, TierDisk, true
}

// lendLocked records that it's value is handed out: lent (pin) or shared.
// A value too small for the pool needs neither (and its loan no Release
// lock: pipelined small GETs are lock-bound).
func (s *Store) lendLocked(it *item, pin bool) Loan {
	if len(it.val) < bufpool.MinSize {
		return Loan{}
	}
	if !pin {
		it.shared = true
		return Loan{}
	}
	it.pins++
	return Loan{it: it, seq: it.seq}
}

// insertClean promotes a block read from disk unless a newer write for the
// key arrived meanwhile, lending it to the reader (see getLocal).
func (s *Store) insertClean(key string, val []byte, expireAt int64, pin bool) Loan {
	s.mu.Lock()
	if _, ok := s.ram[key]; ok {
		// Not stored: the reader's copy is its own.
		s.mu.Unlock()
		return Loan{}
	}
	s.seq++
	it := &item{key: key, val: val, expireAt: expireAt, seq: s.seq}
	loan := s.lendLocked(it, pin)
	s.ram[key] = it
	s.lru.pushFront(it)
	s.ramUsed += int64(len(val))
	victims := s.evictLocked()
	s.gaugesLocked()
	s.mu.Unlock()
	if s.cfg.Observer != nil {
		s.cfg.Observer.Stored(key, TierRAM)
	}
	s.writeVictims(victims)
	return loan
}

func (s *Store) fetchRemote(ctx context.Context, key string) ([]byte, bool) {
	r := s.cfg.Remote
	if r == nil || !r.MayHave(key) {
		return nil, false
	}
	v, err := r.Fetch(ctx, key)
	if err != nil || int64(len(v)) > s.cfg.MaxValue || int64(len(v)) > s.cfg.RAMBytes {
		return nil, false
	}
	s.insert(key, nil, v, 0, true, true)
	return v, true
}

func (s *Store) existsLocal(key string) bool {
	now := s.nowNano()
	s.mu.Lock()
	var at int64
	it, ok := s.ram[key]
	if ok {
		at = it.expireAt // items change under the lock (Expire, SET in place)
	}
	s.mu.Unlock()
	if ok {
		return !expired(at, now)
	}
	return s.disk != nil && s.disk.has(key, now)
}

// Exists reports whether key is held locally or, failing that, fetches it
// from a peer that may hold it (LMCache checks EXISTS before GET, so a block
// only a peer has must count).
func (s *Store) Exists(ctx context.Context, key string) bool {
	if s.existsLocal(key) {
		return true
	}
	_, ok := s.fetchRemote(ctx, key)
	return ok
}

// Delete removes key from every local tier and reports whether it existed.
func (s *Store) Delete(key string) bool {
	now := s.nowNano()
	s.mu.Lock()
	it, inRAM := s.ram[key]
	live := inRAM && !expired(it.expireAt, now)
	if inRAM {
		s.removeRAMLocked(it, true)
		s.gaugesLocked()
	}
	s.mu.Unlock()
	if inRAM && s.cfg.Observer != nil {
		s.cfg.Observer.Removed(key, TierRAM)
	}
	if s.disk != nil {
		onDisk := s.disk.has(key, now)
		if s.disk.del(key, 0) && onDisk {
			live = true
		}
	}
	return live
}

// Expire sets key's expiry (unix ns, 0 removes it) and reports whether the
// key exists.
func (s *Store) Expire(key string, expireAt int64) bool {
	if !s.existsLocal(key) {
		return false
	}
	s.mu.Lock()
	if it, ok := s.ram[key]; ok {
		it.expireAt = expireAt
	}
	s.mu.Unlock()
	if s.disk != nil {
		s.disk.setExpire(key, expireAt)
	}
	return true
}

// ExpireAt returns key's expiry (0 none) and whether it exists.
func (s *Store) ExpireAt(key string) (int64, bool) {
	now := s.nowNano()
	s.mu.Lock()
	var at int64
	it, ok := s.ram[key]
	if ok {
		at = it.expireAt
	}
	s.mu.Unlock()
	if ok {
		if expired(at, now) {
			return 0, false
		}
		return at, true
	}
	if s.disk != nil {
		if at, ok := s.disk.expireOf(key); ok && !expired(at, now) {
			return at, true
		}
	}
	return 0, false
}

// Keys returns every locally held key (RAM ∪ disk), unordered.
func (s *Store) Keys() []string {
	now := s.nowNano()
	s.mu.Lock()
	out := make([]string, 0, len(s.ram))
	for k, it := range s.ram {
		if !expired(it.expireAt, now) {
			out = append(out, k)
		}
	}
	s.mu.Unlock()
	if s.disk != nil {
		out = s.disk.keys(out)
		slices.Sort(out)
		out = slices.Compact(out)
	}
	return out
}

// Len returns the number of distinct keys held locally.
func (s *Store) Len() int {
	if s.disk == nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.ram)
	}
	return len(s.Keys())
}

// Scan returns up to count keys at or after cursor in a stable hash order,
// and the next cursor (0 when done). Keys present for the whole scan are
// returned at least once, as Redis's SCAN promises.
func (s *Store) Scan(cursor uint64, count int, match func(string) bool) ([]string, uint64) {
	type hk struct {
		h uint64
		k string
	}
	keys := s.Keys()
	all := make([]hk, 0, len(keys))
	for _, k := range keys {
		if h := scanHash(k); h >= cursor {
			all = append(all, hk{h, k})
		}
	}
	slices.SortFunc(all, func(a, b hk) int {
		switch {
		case a.h < b.h:
			return -1
		case a.h > b.h:
			return 1
		}
		return 0
	})
	var out []string
	i := 0
	for i < len(all) && (i < count || (i > 0 && all[i].h == all[i-1].h)) {
		if match == nil || match(all[i].k) {
			out = append(out, all[i].k)
		}
		i++
	}
	if i >= len(all) {
		return out, 0
	}
	return out, all[i].h
}

// scanHash maps a key to a non-zero 63-bit cursor position.
func scanHash(k string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(k))
	return h.Sum64()>>1 | 1
}

// Stats summarises the tiers for INFO.
type Stats struct {
	RAMBlocks    int
	RAMBytes     int64
	RAMLimit     int64
	DiskBlocks   int
	DiskBytes    int64
	DiskLimit    int64
	DiskDegraded bool
}

// Stats returns current tier sizes.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	st := Stats{RAMBlocks: len(s.ram), RAMBytes: s.ramUsed, RAMLimit: s.cfg.RAMBytes}
	s.mu.Unlock()
	if s.disk != nil {
		st.DiskBlocks, st.DiskBytes, st.DiskDegraded = s.disk.stats()
		st.DiskLimit = s.cfg.DiskBytes
	}
	return st
}
