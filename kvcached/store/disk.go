package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/vfs"
	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/kvcached/internal/bufpool"
)

// The disk tier keeps each block in its own file, blocks/<xx>/<seq>.blk, and
// the index (key → seq, size, expiry, checksum) in Pebble. A write goes file
// first, index second, so a crash leaves at worst an unindexed file, which
// the next Open deletes; an index entry whose file is missing, short or fails
// its BLAKE3 checksum is answered as a miss and deleted.
//
// Block file layout (little endian):
//
//	magic "OKVB" | version u8 (2) | key length u32 | value length u64 | seq u64 | BLAKE3-256(key || value) | key | value
//
// The seq (also the file's name) and the checksum in the header let a file
// found without an index entry be verified on its own: a file is reused for
// later blocks (pooledFile), so after a power loss a file could hold an
// older block, or parts of two.
//
// Pebble index: key "k" + block key → seq u64 | value length u64 | expireAt i64 (unix ns, 0 = none) | BLAKE3-256(key || value) | flags u8 [| value]
//
// Values up to InlineMax bytes (LMCache's 28-byte metadata keys, small test
// values) live inline in the index entry (flag 1) instead of a file of their
// own: one Pebble write instead of a file create, write and close.
//
// Index writes are not synced one by one. Pebble keeps unsynced WAL records
// in its own memory until a 32 KiB log block fills, so a kill -9 would lose
// every index write since the last full block however old: inline values
// (nothing else holds them) and deletions (the key would come back). The
// walSyncer syncs the WAL walSyncDelay after the first index write that
// follows a sync, which bounds that loss to the last few milliseconds.

const (
	fileMagic   = "OKVB"
	fileVersion = 2
	// Version 1 files (written before the pool of reused files) have no
	// seq or checksum in their header; they are still read.
	fileHeaderV1 = 4 + 1 + 4 + 8
	fileHeader   = fileHeaderV1 + 8 + 32
	indexValLen  = 8 + 8 + 8 + 32 + 1
	// InlineMax is the largest value kept inside the Pebble index.
	InlineMax   = 4 << 10
	indexPrefix = 'k'
)

// Pebble's memory outside the Go heap: at most MemTableStopWritesThreshold
// (2) memtables and the block cache. PebbleBytes is what the process should
// budget for it.
const (
	pebbleCacheBytes    = 2 << 20
	pebbleMemTableBytes = 4 << 20
	PebbleBytes         = pebbleCacheBytes + 2*pebbleMemTableBytes
)

// errCorrupt marks a block that failed verification.
var errCorrupt = errors.New("corrupt block")

type diskEntry struct {
	key      string
	seq      uint64
	size     int64
	expireAt int64
	sum      [32]byte
	inline   bool // value stored in the index entry, no file
	lruLinks[diskEntry]
}

func (e *diskEntry) links() *lruLinks[diskEntry] { return &e.lruLinks }

type diskTier struct {
	dir   string
	limit int64
	db    *pebble.DB
	lock  *pebble.Lock // held from before Open until after Close
	// fsCloser stops the disk-health checker of the index's file system.
	fsCloser io.Closer
	log      hclog.Logger
	m        *Metrics
	events   Observer
	bufs     *bufpool.Pool // read buffers; nil allocates each

	mu         sync.Mutex
	idx        map[string]*diskEntry
	lru        lruList[diskEntry, *diskEntry]
	used       int64 // value bytes of indexed blocks and pooled files
	pool       []pooledFile
	poolSeq    uint64
	degraded   time.Time // zero when healthy; otherwise when writes failed
	retryAfter time.Duration

	// walDirty says an index write happened since the walSyncer last
	// synced; the write that sets it sends on walKick.
	walDirty atomic.Bool
	walKick  chan struct{}
	walStop  chan struct{}
	walDone  chan struct{}
}

// walSyncDelay is how long the walSyncer lets index writes gather before it
// syncs Pebble's WAL: at most one sync (an fdatasync of the log) per delay
// while writes go on, none while there are none.
const walSyncDelay = 5 * time.Millisecond

type pebbleLogger struct{ l hclog.Logger }

func (p pebbleLogger) Infof(format string, args ...any)  { p.l.Debug(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Errorf(format string, args ...any) { p.l.Error(fmt.Sprintf(format, args...)) }
func (p pebbleLogger) Fatalf(format string, args ...any) {
	p.l.Error(fmt.Sprintf(format, args...))
	os.Exit(1)
}

func openDisk(dir string, limit int64, log hclog.Logger, m *Metrics, events Observer) (*diskTier, uint64, error) {
	if err := os.MkdirAll(filepath.Join(dir, "blocks"), 0o700); err != nil {
		return nil, 0, fmt.Errorf("creating disk tier directory: %w", err)
	}
	// Pooled files (below) are not named by the index: a restart drops them.
	if err := os.RemoveAll(filepath.Join(dir, "free")); err != nil {
		return nil, 0, fmt.Errorf("clearing pooled block files: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "free"), 0o700); err != nil {
		return nil, 0, fmt.Errorf("creating disk tier directory: %w", err)
	}
	d := &diskTier{dir: dir, limit: limit, log: log, m: m, events: events,
		idx: make(map[string]*diskEntry), retryAfter: 10 * time.Second,
		walKick: make(chan struct{}, 1), walStop: make(chan struct{}), walDone: make(chan struct{})}
	maxSeq, err := d.openIndex()
	if err != nil {
		var de *indexDamageError
		if !errors.As(err, &de) {
			return nil, 0, err
		}
		// A cache is rebuilt by its clients: a damaged index must not keep
		// the process from starting (Nomad would restart it forever).
		if maxSeq, err = d.discardDamaged(de); err != nil {
			return nil, 0, err
		}
	}
	// Started after load: a kick load's own index writes left is waiting.
	go d.walSyncer()
	return d, maxSeq, nil
}

// indexDamageError is an index that was locked but could not be opened or
// read: a corrupt or missing file, an empty or malformed MANIFEST.
type indexDamageError struct{ err error }

func (e *indexDamageError) Error() string { return "disk index damaged: " + e.err.Error() }
func (e *indexDamageError) Unwrap() error { return e.err }

// damagedSuffix names the copy of a damaged index kept for inspection,
// <data-dir>/index.damaged-<UTC time>; one is kept, older ones are deleted.
const damagedSuffix = ".damaged-"

// openIndex locks, opens and loads the Pebble index. The lock is taken
// first and on its own: an index another process holds is an error (two
// kvcached on one directory), never damage; any error after it is.
func (d *diskTier) openIndex() (uint64, error) {
	idir := filepath.Join(d.dir, "index")
	if err := os.MkdirAll(idir, 0o700); err != nil {
		return 0, fmt.Errorf("creating disk index directory: %w", err)
	}
	// Pebble's disk-health checker is made here rather than by Open, which
	// leaks its goroutine when it fails; d.closeFS stops it.
	fs, fsCloser := vfs.WithDiskHealthChecks(vfs.Default, 5*time.Second, func(info vfs.DiskSlowInfo) {
		d.log.Warn("slow disk index operation", "info", info.String())
	})
	lock, err := pebble.LockDirectory(idir, fs)
	if err != nil {
		fsCloser.Close()
		return 0, fmt.Errorf("locking disk index %s: %w", idir, err)
	}
	// Pebble allocates its block cache and memtables outside the Go heap
	// (cgo), where the process's memory limit does not see them: keep them
	// small. Reads go through the in-memory index first, and only inline
	// values and restarts read Pebble, so a small cache costs little.
	cache := pebble.NewCache(pebbleCacheBytes)
	defer cache.Unref()
	db, err := pebble.Open(idir, &pebble.Options{
		FS:           fs,
		Lock:         lock,
		Logger:       pebbleLogger{d.log.Named("pebble")},
		Cache:        cache,
		MemTableSize: pebbleMemTableBytes,
	})
	if err != nil {
		lock.Close()
		fsCloser.Close()
		return 0, &indexDamageError{fmt.Errorf("opening disk index: %w", err)}
	}
	d.db, d.lock, d.fsCloser = db, lock, fsCloser
	maxSeq, err := d.load()
	if err != nil {
		d.closeDB()
		return 0, err
	}
	return maxSeq, nil
}

// closeDB closes the index and releases its lock and health checker.
func (d *diskTier) closeDB() error {
	err := d.db.Close()
	d.lock.Close()
	d.fsCloser.Close()
	d.db, d.lock, d.fsCloser = nil, nil, nil
	return err
}

// discardDamaged moves a damaged index aside (keeping only the newest such
// copy), drops the block files it named, and opens an empty index. The
// block files are not re-indexed from their headers: values of up to
// InlineMax bytes lived only in the index, LMCache's metadata keys among
// them, and without its metadata a chunk's kv_bytes is never read, yet would
// be announced and kept; reading every block back would also delay the
// start by the time it takes to read the whole disk tier.
func (d *diskTier) discardDamaged(de *indexDamageError) (uint64, error) {
	// What load took in before the damage showed is dropped with the rest.
	d.idx, d.lru, d.used = make(map[string]*diskEntry), lruList[diskEntry, *diskEntry]{}, 0
	idir := filepath.Join(d.dir, "index")
	aside := idir + damagedSuffix + time.Now().UTC().Format("20060102T150405.000000000Z")
	if err := os.Rename(idir, aside); err != nil {
		return 0, fmt.Errorf("%w; moving it aside: %w", de, err)
	}
	if old, err := filepath.Glob(idir + damagedSuffix + "*"); err == nil {
		for _, p := range old {
			if p != aside {
				if err := os.RemoveAll(p); err != nil {
					d.log.Warn("removing an older damaged disk index", "path", p, "error", err)
				}
			}
		}
	}
	blocks := filepath.Join(d.dir, "blocks")
	if err := os.RemoveAll(blocks); err != nil {
		return 0, fmt.Errorf("%w; dropping its block files: %w", de, err)
	}
	if err := os.MkdirAll(blocks, 0o700); err != nil {
		return 0, fmt.Errorf("creating disk tier directory: %w", err)
	}
	d.m.IndexDamaged.Inc()
	d.log.Error("disk index damaged: moved aside, the disk tier starts empty", "error", de.err, "moved_to", aside)
	maxSeq, err := d.openIndex()
	if err != nil {
		return 0, fmt.Errorf("opening a new disk index after moving a damaged one aside: %w", err)
	}
	return maxSeq, nil
}

// indexWritten records an unsynced index write for the walSyncer. It is
// called after the write, so the sync that follows covers it.
func (d *diskTier) indexWritten() {
	if !d.walDirty.Load() && d.walDirty.CompareAndSwap(false, true) {
		select {
		case d.walKick <- struct{}{}:
		default:
		}
	}
}

// walSyncer syncs Pebble's WAL walSyncDelay after an index write, so a kill
// keeps every index write older than that (see the comment at the top of
// this file). The flag is cleared before the sync: a write that lands
// during the sync kicks the next one.
func (d *diskTier) walSyncer() {
	defer close(d.walDone)
	for {
		select {
		case <-d.walKick:
		case <-d.walStop:
			return
		}
		select {
		case <-time.After(walSyncDelay):
		case <-d.walStop:
			return // closing the database syncs the WAL
		}
		d.walDirty.Store(false)
		if err := d.db.LogData(nil, pebble.Sync); err != nil {
			d.log.Warn("syncing the disk index's log", "error", err)
		}
	}
}

// load rebuilds the in-memory index from Pebble and deletes block files that
// no index entry references (writes a crash interrupted).
func (d *diskTier) load() (uint64, error) {
	it, err := d.db.NewIter(&pebble.IterOptions{LowerBound: []byte{indexPrefix}, UpperBound: []byte{indexPrefix + 1}})
	if err != nil {
		return 0, &indexDamageError{fmt.Errorf("reading disk index: %w", err)}
	}
	var maxSeq uint64
	live := make(map[uint64]string) // seq → key of indexed blocks not yet seen on disk
	for it.First(); it.Valid(); it.Next() {
		v := it.Value()
		if len(v) < indexValLen || (v[indexValLen-1] == 0) != (len(v) == indexValLen) {
			d.log.Warn("dropping malformed index entry", "key", fmt.Sprintf("%q", it.Key()[1:]))
			d.db.Delete(bytes.Clone(it.Key()), pebble.NoSync)
			d.indexWritten()
			continue
		}
		e := &diskEntry{key: string(it.Key()[1:])}
		e.seq = binary.LittleEndian.Uint64(v)
		e.size = int64(binary.LittleEndian.Uint64(v[8:]))
		e.expireAt = int64(binary.LittleEndian.Uint64(v[16:]))
		copy(e.sum[:], v[24:])
		e.inline = v[indexValLen-1] == 1
		d.idx[e.key] = e
		d.lru.pushFront(e)
		d.used += e.size
		if !e.inline {
			live[e.seq] = e.key
		}
		maxSeq = max(maxSeq, e.seq)
	}
	if err := it.Close(); err != nil {
		return 0, &indexDamageError{fmt.Errorf("reading disk index: %w", err)}
	}
	// Block files the index does not name were written just before a crash
	// whose index records had not reached the WAL (Pebble writes unsynced
	// records in 32 KiB log blocks). A file whose length matches its header
	// was written completely, so it is re-indexed; a torn one is deleted.
	recovered, orphans := 0, 0
	err = filepath.WalkDir(filepath.Join(d.dir, "blocks"), func(path string, de fs.DirEntry, err error) error {
		if err != nil || de.IsDir() {
			return err
		}
		name := de.Name()
		seq, perr := strconv.ParseUint(strings.TrimSuffix(name, ".blk"), 16, 64)
		if perr != nil || filepath.Ext(name) != ".blk" {
			orphans++
			return os.Remove(path)
		}
		if _, ok := live[seq]; ok {
			delete(live, seq)
			maxSeq = max(maxSeq, seq)
			return nil
		}
		if d.recover(path, seq) {
			recovered++
			maxSeq = max(maxSeq, seq)
			return nil
		}
		orphans++
		return os.Remove(path)
	})
	if err != nil {
		return 0, fmt.Errorf("scanning block files: %w", err)
	}
	// Index entries whose file is gone were deleted just before a crash
	// that lost the index record of the deletion.
	for seq, key := range live {
		if e := d.idx[key]; e != nil && e.seq == seq {
			d.removeLocked(e)
		}
	}
	d.log.Info("disk tier loaded", "blocks", len(d.idx), "bytes", d.used, "recovered", recovered, "orphans_removed", orphans, "missing_files", len(live))
	d.m.bytesDisk.Set(float64(d.used))
	d.m.blocksDisk.Set(float64(len(d.idx)))
	return maxSeq, nil
}

// recover re-indexes a complete block file left unindexed by a crash,
// unless the index holds a newer write of its key.
func (d *diskTier) recover(path string, seq uint64) bool {
	b, err := os.ReadFile(path)
	if err != nil || len(b) < fileHeaderV1 || string(b[:4]) != fileMagic || (b[4] != 1 && b[4] != fileVersion) {
		return false
	}
	hl := uint64(fileHeaderV1)
	if b[4] == fileVersion {
		hl = fileHeader
	}
	kl := uint64(binary.LittleEndian.Uint32(b[5:]))
	vl := binary.LittleEndian.Uint64(b[9:])
	if uint64(len(b)) < hl || uint64(len(b)) != hl+kl+vl {
		return false
	}
	key := string(b[hl : hl+kl])
	old := d.idx[key]
	if old != nil && old.seq > seq {
		return false
	}
	e := &diskEntry{key: key, seq: seq, size: int64(vl)}
	e.sum = blockSum(key, b[hl+kl:])
	if b[4] == fileVersion && (binary.LittleEndian.Uint64(b[fileHeaderV1:]) != seq || [32]byte(b[fileHeaderV1+8:fileHeader]) != e.sum) {
		// Another block's file under this name, or a torn mix of two.
		return false
	}
	if err := d.db.Set(indexKey(key), encodeIndex(e), pebble.NoSync); err != nil {
		return false
	}
	d.indexWritten()
	if old != nil {
		// The older write's file is an orphan now; the walk may already
		// have passed it, so remove it here.
		d.lru.unlink(old)
		d.used -= old.size
		d.removeFile(old)
	}
	d.idx[key] = e
	d.lru.pushFront(e)
	d.used += e.size
	return true
}

func (d *diskTier) close() error {
	close(d.walStop)
	<-d.walDone
	return d.closeDB()
}

func (d *diskTier) path(seq uint64) string {
	return filepath.Join(d.dir, "blocks", fmt.Sprintf("%02x", seq&0xff), fmt.Sprintf("%016x.blk", seq))
}

func (d *diskTier) updateGauges() {
	d.m.bytesDisk.Set(float64(d.used))
	d.m.blocksDisk.Set(float64(len(d.idx)))
}

// writable reports whether writes are allowed now: after a failed write the
// tier stays read-only for retryAfter, so a full disk costs one failed write
// per interval rather than one per block.
func (d *diskTier) writable() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.degraded.IsZero() || time.Since(d.degraded) >= d.retryAfter
}

func (d *diskTier) setDegraded(err error) {
	d.mu.Lock()
	first := d.degraded.IsZero()
	d.degraded = time.Now()
	d.mu.Unlock()
	d.m.DiskDegraded.Set(1)
	d.m.SpillErrors.Inc()
	if first {
		d.log.Error("disk tier write failed; running RAM-only until a write succeeds", "error", err)
	}
}

func (d *diskTier) setHealthy() {
	d.mu.Lock()
	was := !d.degraded.IsZero()
	d.degraded = time.Time{}
	d.mu.Unlock()
	if was {
		d.m.DiskDegraded.Set(0)
		d.log.Info("disk tier writes recovered")
	}
}

func (d *diskTier) has(key string, now int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.idx[key]
	return ok && (e.expireAt == 0 || e.expireAt > now)
}

// put writes a block with write sequence seq. A put older than what the index
// holds for key is discarded, so concurrent writers settle on the newest.
func (d *diskTier) put(key string, val []byte, expireAt int64, seq uint64) error {
	size := int64(len(val))
	if size > d.limit {
		return fmt.Errorf("block of %d bytes exceeds the disk tier's %d bytes", size, d.limit)
	}
	sum := blockSum(key, val)

	// Make room first so the tier never exceeds its limit, even briefly.
	d.mu.Lock()
	if cur, ok := d.idx[key]; ok && cur.seq >= seq {
		d.mu.Unlock()
		return nil
	}
	inline := size <= InlineMax
	var reuse *pooledFile
	if n := len(d.pool); n > 0 && !inline {
		p := d.pool[n-1] // a copy: recycle appends over the slot once unlocked
		reuse = &p
		d.pool = d.pool[:n-1]
		d.used -= p.size
	}
	var victims []*diskEntry
	var unpooled []pooledFile
	for d.used+size > d.limit {
		if n := len(d.pool); n > 0 {
			unpooled = append(unpooled, d.pool[n-1])
			d.pool = d.pool[:n-1]
			d.used -= unpooled[len(unpooled)-1].size
			continue
		}
		if d.lru.tail == nil {
			break
		}
		v := d.lru.tail
		d.removeLocked(v)
		victims = append(victims, v)
	}
	d.used += size // reserve
	d.mu.Unlock()
	for _, p := range unpooled {
		os.Remove(p.path)
	}
	d.dropFiles(victims, true)

	e := &diskEntry{key: key, seq: seq, size: size, expireAt: expireAt, sum: sum, inline: inline}
	var idxVal []byte
	if e.inline {
		idxVal = append(encodeIndex(e), val...)
	} else {
		if err := d.writeFile(seq, key, val, sum, reuse); err != nil {
			d.mu.Lock()
			d.used -= size
			d.mu.Unlock()
			return err
		}
		idxVal = encodeIndex(e)
	}
	d.mu.Lock()
	if cur, ok := d.idx[key]; ok && cur.seq >= seq {
		d.used -= size
		d.mu.Unlock()
		d.removeFile(e)
		return nil
	}
	if err := d.db.Set(indexKey(key), idxVal, pebble.NoSync); err != nil {
		d.used -= size
		d.mu.Unlock()
		d.removeFile(e)
		return fmt.Errorf("indexing block: %w", err)
	}
	d.indexWritten()
	old := d.idx[key]
	if old != nil {
		d.lru.unlink(old)
		d.used -= old.size
	}
	d.idx[key] = e
	d.lru.pushFront(e)
	d.updateGauges()
	d.mu.Unlock()
	if old != nil {
		d.recycle(old)
	} else if d.events != nil {
		d.events.Stored(key, TierDisk)
	}
	return nil
}

func (d *diskTier) removeFile(e *diskEntry) {
	if !e.inline {
		os.Remove(d.path(e.seq))
	}
}

// pooledFile is a block file the index no longer names (its block was
// overwritten or deleted), renamed into free/ to be overwritten by a later
// block rather than deleted. Creating a file and deleting one per 1 MiB
// block (ext4 inode allocation, page-cache pages freed and allocated again)
// costs more CPU than the write itself when keys are rewritten in turn.
type pooledFile struct {
	path string
	size int64 // value bytes, still counted in the tier's used bytes
}

// maxPooled is about how many files the pool keeps; more are deleted.
const maxPooled = 64

// recycle moves the file of e, an entry already out of the index, into the
// pool, or deletes it when the pool is full or the tier has no room for it.
// A block file is never overwritten under its own name, so a reader that
// opened it before sees either the block it expected or a checksum failure,
// which get treats as the miss a concurrent delete is.
func (d *diskTier) recycle(e *diskEntry) {
	if e.inline {
		return
	}
	src := d.path(e.seq)
	d.mu.Lock()
	if len(d.pool) >= maxPooled || d.used+e.size > d.limit {
		d.mu.Unlock()
		os.Remove(src)
		return
	}
	d.poolSeq++
	p := pooledFile{path: filepath.Join(d.dir, "free", strconv.FormatUint(d.poolSeq, 16)), size: e.size}
	d.used += p.size
	d.mu.Unlock()
	if err := os.Rename(src, p.path); err != nil {
		d.mu.Lock()
		d.used -= p.size
		d.mu.Unlock()
		os.Remove(src)
		return
	}
	d.mu.Lock()
	d.pool = append(d.pool, p)
	d.mu.Unlock()
}

// writeFile writes a block file: into a pooled file when reuse is not nil
// (overwritten in place, cut to length, then renamed to its name, so the
// name appears only once the block is whole), else into a new file.
func (d *diskTier) writeFile(seq uint64, key string, val []byte, sum [32]byte, reuse *pooledFile) error {
	var hdr [fileHeader]byte
	copy(hdr[:], fileMagic)
	hdr[4] = fileVersion
	binary.LittleEndian.PutUint32(hdr[5:], uint32(len(key)))
	binary.LittleEndian.PutUint64(hdr[9:], uint64(len(val)))
	binary.LittleEndian.PutUint64(hdr[fileHeaderV1:], seq)
	copy(hdr[fileHeaderV1+8:], sum[:])
	buf := make([]byte, 0, fileHeader+len(key))
	buf = append(append(buf, hdr[:]...), key...)
	if reuse != nil {
		err := d.overwrite(*reuse, d.path(seq), buf, val)
		if err == nil {
			return nil
		}
		os.Remove(reuse.path)
		d.log.Debug("reusing a pooled block file failed; creating one", "error", err)
	}
	p := d.path(seq)
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(p), 0o700); err == nil {
			f, err = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		}
	}
	if err != nil {
		return fmt.Errorf("creating block file: %w", err)
	}
	if _, err = f.Write(buf); err == nil {
		_, err = f.Write(val)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(p)
		return fmt.Errorf("writing block file: %w", err)
	}
	return nil
}

// overwrite writes head and val into the pooled file p from offset 0, cuts
// it to their length and renames it to dst.
func (d *diskTier) overwrite(p pooledFile, dst string, head, val []byte) error {
	f, err := os.OpenFile(p.path, os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("opening pooled block file: %w", err)
	}
	n := int64(len(head) + len(val))
	if _, err = f.WriteAt(head, 0); err == nil {
		_, err = f.WriteAt(val, int64(len(head)))
	}
	if err == nil {
		err = f.Truncate(n) // the file may have held a longer block
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("writing pooled block file: %w", err)
	}
	err = os.Rename(p.path, dst)
	if errors.Is(err, fs.ErrNotExist) {
		if err = os.MkdirAll(filepath.Dir(dst), 0o700); err == nil {
			err = os.Rename(p.path, dst)
		}
	}
	if err != nil {
		return fmt.Errorf("naming block file: %w", err)
	}
	return nil
}

// get reads and verifies a block. A corrupt block is deleted and reported as
// errCorrupt; an absent or expired one as ok=false.
func (d *diskTier) get(key string, now int64) (val []byte, expireAt int64, ok bool, err error) {
	d.mu.Lock()
	e, found := d.idx[key]
	if found && e.expireAt != 0 && e.expireAt <= now {
		d.removeLocked(e)
		d.mu.Unlock()
		d.dropFiles([]*diskEntry{e}, false)
		return nil, 0, false, nil
	}
	if found {
		d.lru.unlink(e)
		d.lru.pushFront(e)
	}
	var seq uint64
	var size int64
	var sum [32]byte
	var inline bool
	if found {
		seq, size, sum, expireAt, inline = e.seq, e.size, e.sum, e.expireAt, e.inline
	}
	d.mu.Unlock()
	if !found {
		return nil, 0, false, nil
	}
	var rerr error
	if inline {
		val, rerr = d.readInline(key, seq, sum)
	} else {
		val, rerr = d.readFile(seq, key, size, sum)
	}
	if rerr != nil {
		d.mu.Lock()
		cur := d.idx[key]
		if cur == nil || cur.seq != seq {
			// Overwritten or deleted during the read (its file renamed,
			// pooled, or reused): the miss a read racing a delete is, not
			// a corrupt block.
			d.mu.Unlock()
			return nil, 0, false, nil
		}
		d.removeLocked(cur)
		d.mu.Unlock()
		d.m.Corrupt.Inc()
		d.log.Warn("dropping corrupt disk block", "key", fmt.Sprintf("%q", key), "error", rerr)
		// Deleted, not pooled: a file that failed verification is not reused.
		d.removeFile(cur)
		if d.events != nil {
			d.events.Removed(key, TierDisk)
		}
		return nil, 0, false, fmt.Errorf("%w: %v", errCorrupt, rerr)
	}
	return val, expireAt, true, nil
}

func (d *diskTier) readInline(key string, seq uint64, sum [32]byte) ([]byte, error) {
	v, closer, err := d.db.Get(indexKey(key))
	if err != nil {
		return nil, fmt.Errorf("reading inline block: %w", err)
	}
	defer closer.Close()
	if len(v) < indexValLen || binary.LittleEndian.Uint64(v) != seq {
		return nil, errors.New("index entry changed under the read")
	}
	val := bytes.Clone(v[indexValLen:])
	if uint64(len(val)) != binary.LittleEndian.Uint64(v[8:]) {
		return nil, errors.New("inline value length mismatch")
	}
	if blockSum(key, val) != sum {
		return nil, errors.New("checksum mismatch")
	}
	return val, nil
}

// readFile reads a block file with two preads, the value straight into a
// buffer of its size (not zeroed first: the read fills it), which becomes the
// promoted RAM copy as it is.
func (d *diskTier) readFile(seq uint64, key string, size int64, sum [32]byte) ([]byte, error) {
	f, err := os.Open(d.path(seq))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var hdr [fileHeader + 256]byte
	head := hdr[:min(len(hdr), fileHeader+len(key))]
	if n, err := f.ReadAt(head, 0); err != nil && !(errors.Is(err, io.EOF) && n >= fileHeaderV1) {
		return nil, fmt.Errorf("reading block file header: %w", err)
	}
	if string(head[:4]) != fileMagic || (head[4] != 1 && head[4] != fileVersion) {
		return nil, errors.New("bad block file header")
	}
	hl := fileHeaderV1
	if head[4] == fileVersion {
		hl = fileHeader
		if binary.LittleEndian.Uint64(head[fileHeaderV1:]) != seq || [32]byte(head[fileHeaderV1+8:fileHeader]) != sum {
			return nil, errors.New("block file holds another block")
		}
	}
	kl := int(binary.LittleEndian.Uint32(head[5:]))
	vl := binary.LittleEndian.Uint64(head[9:])
	if kl != len(key) || vl != uint64(size) {
		return nil, fmt.Errorf("block file header says key %d and value %d bytes, index %d and %d", kl, vl, len(key), size)
	}
	if len(head) >= hl+kl {
		if string(head[hl:hl+kl]) != key {
			return nil, errors.New("block file holds another key")
		}
	} else {
		stored := make([]byte, kl)
		if _, err := f.ReadAt(stored, int64(hl)); err != nil {
			return nil, fmt.Errorf("reading block file key: %w", err)
		}
		if string(stored) != key {
			return nil, errors.New("block file holds another key")
		}
	}
	val := d.bufs.Get(int(vl))
	if _, err := f.ReadAt(val, int64(hl+kl)); err != nil {
		d.bufs.Put(val)
		return nil, fmt.Errorf("reading block file value: %w", err)
	}
	if readSum(key, val) != sum {
		d.bufs.Put(val)
		return nil, errors.New("checksum mismatch")
	}
	return val, nil
}

// removeLocked drops e from the index (memory and Pebble); the caller removes
// the file with dropFiles after unlocking.
func (d *diskTier) removeLocked(e *diskEntry) {
	if d.idx[e.key] != e {
		return
	}
	delete(d.idx, e.key)
	d.lru.unlink(e)
	d.used -= e.size
	if err := d.db.Delete(indexKey(e.key), pebble.NoSync); err != nil {
		d.log.Warn("deleting index entry", "error", err)
	}
	d.indexWritten()
	d.updateGauges()
}

// dropFiles removes the files of entries already out of the index: evicted
// ones are deleted (the tier is making room), others pooled for reuse.
func (d *diskTier) dropFiles(es []*diskEntry, evicted bool) {
	for _, e := range es {
		if evicted {
			d.removeFile(e)
			d.m.evictDisk.Inc()
		} else {
			d.recycle(e)
		}
		if d.events != nil {
			d.events.Removed(e.key, TierDisk)
		}
	}
}

// del removes key; with seq non-zero only if the stored write is that one.
func (d *diskTier) del(key string, seq uint64) bool {
	d.mu.Lock()
	e, ok := d.idx[key]
	if !ok || (seq != 0 && e.seq != seq) {
		d.mu.Unlock()
		return false
	}
	d.removeLocked(e)
	d.mu.Unlock()
	d.dropFiles([]*diskEntry{e}, false)
	return true
}

// delOlder removes key if the stored write is older than seq.
func (d *diskTier) delOlder(key string, seq uint64) {
	d.mu.Lock()
	e, ok := d.idx[key]
	if !ok || e.seq >= seq {
		d.mu.Unlock()
		return
	}
	d.removeLocked(e)
	d.mu.Unlock()
	d.dropFiles([]*diskEntry{e}, false)
}

func (d *diskTier) setExpire(key string, expireAt int64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.idx[key]
	if !ok {
		return false
	}
	e.expireAt = expireAt
	v := encodeIndex(e)
	if e.inline {
		cur, closer, err := d.db.Get(indexKey(key))
		if err != nil {
			d.log.Warn("reading index entry to update expiry", "error", err)
			return true
		}
		v = append(v, cur[min(len(cur), indexValLen):]...)
		closer.Close()
	}
	if err := d.db.Set(indexKey(key), v, pebble.NoSync); err != nil {
		d.log.Warn("updating expiry in index", "error", err)
	}
	d.indexWritten()
	return true
}

// size returns key's value length, 0 when absent.
func (d *diskTier) size(key string) int64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e, ok := d.idx[key]; ok {
		return e.size
	}
	return 0
}

func (d *diskTier) expireOf(key string) (int64, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	e, ok := d.idx[key]
	if !ok {
		return 0, false
	}
	return e.expireAt, true
}

func (d *diskTier) keys(dst []string) []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	for k := range d.idx {
		dst = append(dst, k)
	}
	return dst
}

func (d *diskTier) stats() (blocks int, used int64, degraded bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.idx), d.used, !d.degraded.IsZero()
}

func indexKey(key string) []byte {
	b := make([]byte, 0, 1+len(key))
	return append(append(b, indexPrefix), key...)
}

func encodeIndex(e *diskEntry) []byte {
	n := indexValLen
	if e.inline {
		n += int(e.size)
	}
	v := make([]byte, indexValLen, n)
	binary.LittleEndian.PutUint64(v, e.seq)
	binary.LittleEndian.PutUint64(v[8:], uint64(e.size))
	binary.LittleEndian.PutUint64(v[16:], uint64(e.expireAt))
	copy(v[24:], e.sum[:])
	if e.inline {
		v[indexValLen-1] = 1
	}
	return v
}
