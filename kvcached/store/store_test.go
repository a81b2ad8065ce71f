package store

import (
	"bytes"
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

func open(t *testing.T, dir string, ram, disk int64) (*Store, *Metrics) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry())
	s, err := Open(Config{RAMBytes: ram, DiskBytes: disk, Dir: dir, Metrics: m, MaxValue: 1 << 20})
	must.NoError(t, err)
	return s, m
}

func val(i, n int) []byte { return bytes.Repeat([]byte{byte(i)}, n) }

func TestRAMOnlyEvictsLRU(t *testing.T) {
	s, m := open(t, "", 3000, 0)
	defer s.Close()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		_, err := s.Set(fmt.Sprint(i), val(i, 1000), 0, SetAlways)
		must.NoError(t, err)
	}
	_, _, ok := s.Get(ctx, "0") // 0 becomes most recent; 1 is now the LRU
	must.True(t, ok)
	_, err := s.Set("3", val(3, 1000), 0, SetAlways)
	must.NoError(t, err)
	_, _, ok = s.Get(ctx, "1")
	must.False(t, ok)
	for _, k := range []string{"0", "2", "3"} {
		v, tier, ok := s.Get(ctx, k)
		must.True(t, ok, must.Sprint(k))
		must.Eq(t, TierRAM, tier)
		must.Eq(t, 1000, len(v))
	}
	must.Eq(t, 1.0, promtest.ToFloat64(m.Evictions.WithLabelValues("ram")))
	must.Eq(t, 1.0, promtest.ToFloat64(m.Misses))
	must.Eq(t, int64(3000), s.Stats().RAMBytes)
}

func TestSpillPromoteEvictAndRestart(t *testing.T) {
	dir := t.TempDir()
	s, m := open(t, dir, 2500, 5000)
	ctx := context.Background()
	for i := 0; i < 4; i++ {
		_, err := s.Set(fmt.Sprint(i), val(i, 1000), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(ctx))
	st := s.Stats()
	must.Eq(t, 2, st.RAMBlocks)
	must.Eq(t, 4, st.DiskBlocks)
	// 0 was evicted from RAM; it comes back from disk and is promoted.
	v, tier, ok := s.Get(ctx, "0")
	must.True(t, ok)
	must.Eq(t, TierDisk, tier)
	must.Eq(t, val(0, 1000), v)
	must.Eq(t, 1.0, promtest.ToFloat64(m.Promotions))
	_, tier, _ = s.Get(ctx, "0")
	must.Eq(t, TierRAM, tier)
	// Two more blocks push the oldest ones out of the 5000-byte disk tier.
	for i := 4; i < 6; i++ {
		_, err := s.Set(fmt.Sprint(i), val(i, 1000), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(ctx))
	must.Eq(t, 5, s.Stats().DiskBlocks)
	must.Eq(t, 1.0, promtest.ToFloat64(m.Evictions.WithLabelValues("disk")))
	must.NoError(t, s.Close())

	// A restart keeps the disk tier.
	s2, _ := open(t, dir, 2500, 5000)
	defer s2.Close()
	must.Eq(t, 5, s2.Stats().DiskBlocks)
	n := 0
	for i := 0; i < 6; i++ {
		if v, _, ok := s2.Get(ctx, fmt.Sprint(i)); ok {
			must.Eq(t, val(i, 1000), v)
			n++
		}
	}
	must.Eq(t, 5, n)
}

func TestCorruptBlockIsAMissAndDeleted(t *testing.T) {
	dir := t.TempDir()
	s, m := open(t, dir, 5000, 100000)
	defer s.Close()
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		_, err := s.Set(fmt.Sprint(i), val(i, 5000), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(ctx))
	// Flip a byte of block 0's value and truncate block 1's file.
	d := s.disk
	e0, e1 := d.idx["0"], d.idx["1"]
	b, err := os.ReadFile(d.path(e0.seq))
	must.NoError(t, err)
	b[len(b)-10] ^= 0xff
	must.NoError(t, os.WriteFile(d.path(e0.seq), b, 0o600))
	must.NoError(t, os.Truncate(d.path(e1.seq), 100))

	for _, k := range []string{"0", "1"} {
		_, _, ok := s.Get(ctx, k)
		must.False(t, ok, must.Sprint(k))
	}
	must.Eq(t, 2.0, promtest.ToFloat64(m.Corrupt))
	must.Eq(t, 1, s.Stats().DiskBlocks)
	_, err = os.Stat(d.path(e0.seq))
	must.True(t, os.IsNotExist(err))
	v, _, ok := s.Get(ctx, "2")
	must.True(t, ok)
	must.Eq(t, val(2, 5000), v)
}

func TestOrphanFilesRemovedOnOpen(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, 1000, 10000)
	_, err := s.Set("a", val(1, 10), 0, SetAlways)
	must.NoError(t, err)
	must.NoError(t, s.Close())
	orphan := filepath.Join(dir, "blocks", "ff", "00000000000000ff.blk")
	must.NoError(t, os.MkdirAll(filepath.Dir(orphan), 0o700))
	must.NoError(t, os.WriteFile(orphan, []byte("torn"), 0o600))
	s2, _ := open(t, dir, 1000, 10000)
	defer s2.Close()
	_, err = os.Stat(orphan)
	must.True(t, os.IsNotExist(err))
	v, _, ok := s2.Get(context.Background(), "a")
	must.True(t, ok)
	must.Eq(t, val(1, 10), v)
}

func TestSetModesDeleteExpire(t *testing.T) {
	s, _ := open(t, t.TempDir(), 1<<20, 1<<20)
	defer s.Close()
	ctx := context.Background()
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }

	ok, err := s.Set("k", []byte("1"), 0, SetXX)
	must.NoError(t, err)
	must.False(t, ok)
	ok, _ = s.Set("k", []byte("1"), 0, SetNX)
	must.True(t, ok)
	ok, _ = s.Set("k", []byte("2"), 0, SetNX)
	must.False(t, ok)
	ok, _ = s.Set("k", []byte("3"), 0, SetXX)
	must.True(t, ok)
	v, _, _ := s.Get(ctx, "k")
	must.Eq(t, "3", string(v))

	must.True(t, s.Expire("k", now.Add(time.Second).UnixNano()))
	at, ok := s.ExpireAt("k")
	must.True(t, ok)
	must.Eq(t, now.Add(time.Second).UnixNano(), at)
	now = now.Add(2 * time.Second)
	_, _, ok = s.Get(ctx, "k")
	must.False(t, ok)

	// Expiry on a block only the disk holds (inline in the index).
	_, _ = s.Set("inl", []byte("inline value"), 0, SetAlways)
	must.NoError(t, s.Flush(ctx))
	s.mu.Lock()
	s.removeRAMLocked(s.ram["inl"], false)
	s.mu.Unlock()
	must.True(t, s.Expire("inl", now.Add(time.Hour).UnixNano()))
	v, tier, ok := s.Get(ctx, "inl")
	must.True(t, ok)
	must.Eq(t, TierDisk, tier)
	must.Eq(t, "inline value", string(v))
	at, _ = s.ExpireAt("inl")
	must.Eq(t, now.Add(time.Hour).UnixNano(), at)

	_, _ = s.Set("d", []byte("x"), 0, SetAlways)
	must.NoError(t, s.Flush(ctx))
	must.True(t, s.Delete("d"))
	must.False(t, s.Delete("d"))
	must.False(t, s.Exists(ctx, "d"))
	must.Eq(t, 1, s.Stats().DiskBlocks) // "inl" only

	_, err = s.Set("big", make([]byte, 2<<20), 0, SetAlways)
	var tl *ValueTooLargeError
	must.ErrorAs(t, err, &tl)
}

func TestScanVisitsEveryKeyOnce(t *testing.T) {
	s, _ := open(t, "", 1<<20, 0)
	defer s.Close()
	want := map[string]bool{}
	for i := 0; i < 250; i++ {
		k := fmt.Sprintf("key:%d", i)
		want[k] = true
		_, err := s.Set(k, []byte("v"), 0, SetAlways)
		must.NoError(t, err)
	}
	got := map[string]int{}
	cursor := uint64(0)
	for {
		keys, next := s.Scan(cursor, 17, nil)
		for _, k := range keys {
			got[k]++
		}
		if next == 0 {
			break
		}
		must.Greater(t, cursor, next)
		cursor = next
	}
	must.MapLen(t, 250, got)
	for k, n := range got {
		must.True(t, want[k])
		must.Eq(t, 1, n)
	}
}

func TestDiskUnwritableDegradesToRAMOnly(t *testing.T) {
	dir := t.TempDir()
	s, m := open(t, dir, 20000, 1<<20)
	defer s.Close()
	ctx := context.Background()
	// Make the block directory unwritable by replacing it with a file:
	// every block write then fails, as on a full disk.
	must.NoError(t, os.RemoveAll(filepath.Join(dir, "blocks")))
	must.NoError(t, os.WriteFile(filepath.Join(dir, "blocks"), nil, 0o600))
	for i := 0; i < 4; i++ {
		_, err := s.Set(fmt.Sprint(i), val(i, 5000), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(ctx))
	must.Eq(t, 1.0, promtest.ToFloat64(m.DiskDegraded))
	must.True(t, s.Stats().DiskDegraded)
	v, _, ok := s.Get(ctx, "3")
	must.True(t, ok)
	must.Eq(t, val(3, 5000), v)
}

// TestUnindexedCompleteBlockIsRecovered simulates a crash that lost the
// index record of a finished block write: the block is re-indexed on open,
// and an index entry whose file is gone is dropped.
func TestUnindexedCompleteBlockIsRecovered(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, 1<<20, 1<<20)
	for _, k := range []string{"kept", "lost-index", "lost-file"} {
		_, err := s.Set(k, []byte(strings.Repeat("value of "+k, 1000)), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(context.Background()))
	gone := s.disk.path(s.disk.idx["lost-file"].seq)
	must.NoError(t, s.disk.db.Delete(indexKey("lost-index"), nil))
	must.NoError(t, s.Close())
	must.NoError(t, os.Remove(gone))

	s2, m := open(t, dir, 1<<20, 1<<20)
	defer s2.Close()
	must.Eq(t, 2, s2.Stats().DiskBlocks)
	for _, k := range []string{"kept", "lost-index"} {
		v, tier, ok := s2.Get(context.Background(), k)
		must.True(t, ok, must.Sprint(k))
		must.Eq(t, TierDisk, tier)
		must.Eq(t, strings.Repeat("value of "+k, 1000), string(v))
	}
	_, _, ok := s2.Get(context.Background(), "lost-file")
	must.False(t, ok)
	must.Eq(t, 0.0, promtest.ToFloat64(m.Corrupt))
}

// TestSupersededBlocksAreNotWritten checks write-back coalescing: a key
// overwritten faster than the spill delay is written to disk once, with its
// last value, and a block deleted before its spill is never written.
func TestSupersededBlocksAreNotWritten(t *testing.T) {
	dir := t.TempDir()
	m := NewMetrics(prometheus.NewRegistry())
	// A delay no test run reaches: only Flush ends it.
	s, err := Open(Config{RAMBytes: 1 << 20, DiskBytes: 1 << 20, Dir: dir, Metrics: m, SpillDelay: time.Hour})
	must.NoError(t, err)
	for i := 0; i < 50; i++ {
		_, err := s.Set("hot", val(i, 8000), 0, SetAlways)
		must.NoError(t, err)
	}
	_, err = s.Set("gone", val(1, 8000), 0, SetAlways)
	must.NoError(t, err)
	must.True(t, s.Delete("gone"))
	must.NoError(t, s.Flush(context.Background()))
	must.Eq(t, 1.0, promtest.ToFloat64(m.Spills))
	must.NoError(t, s.Close())

	s, _ = open(t, dir, 1<<20, 1<<20)
	defer s.Close()
	v, tier, ok := s.Get(context.Background(), "hot")
	must.True(t, ok)
	must.Eq(t, TierDisk, tier)
	must.Eq(t, val(49, 8000), v)
	_, _, ok = s.Get(context.Background(), "gone")
	must.False(t, ok)
}

// TestFlushWritesBlocksAFullQueueLeftOut: with a one-block spill queue,
// blocks that did not fit are still on disk after Flush.
func TestFlushWritesBlocksAFullQueueLeftOut(t *testing.T) {
	dir := t.TempDir()
	m := NewMetrics(prometheus.NewRegistry())
	s, err := Open(Config{RAMBytes: 1 << 20, DiskBytes: 1 << 20, Dir: dir, Metrics: m, SpillQueue: 1})
	must.NoError(t, err)
	for i := 0; i < 20; i++ {
		_, err := s.Set(fmt.Sprint(i), val(i, 5000), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(context.Background()))
	must.Eq(t, 20.0, promtest.ToFloat64(m.Spills))
	must.Eq(t, 20, s.Stats().DiskBlocks)
	must.NoError(t, s.Close())
}

// TestOverwrittenBlockEvictedBeforeItsSpill: a key rewritten while its
// spill entry waits keeps one entry; when RAM evicts the key first, the
// evicting request writes its newest value, and the entry, reached later,
// writes nothing stale over it.
func TestOverwrittenBlockEvictedBeforeItsSpill(t *testing.T) {
	dir := t.TempDir()
	m := NewMetrics(prometheus.NewRegistry())
	s, err := Open(Config{RAMBytes: 20000, DiskBytes: 1 << 20, Dir: dir, Metrics: m, SpillDelay: time.Hour})
	must.NoError(t, err)
	for i := 0; i < 10; i++ {
		_, err := s.Set("hot", val(i, 8000), 0, SetAlways)
		must.NoError(t, err)
	}
	for i, k := range []string{"a", "b", "c"} {
		_, err := s.Set(k, val(100+i, 8000), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(context.Background()))
	// hot (evicted, written by the evicting SET), a (evicted likewise), and
	// b and c written by Flush: one write each.
	must.Eq(t, 4.0, promtest.ToFloat64(m.Spills))
	must.NoError(t, s.Close())

	s, _ = open(t, dir, 1<<20, 1<<20)
	defer s.Close()
	v, _, ok := s.Get(context.Background(), "hot")
	must.True(t, ok)
	must.Eq(t, val(9, 8000), v)
	for i, k := range []string{"a", "b", "c"} {
		v, _, ok := s.Get(context.Background(), k)
		must.True(t, ok)
		must.Eq(t, val(100+i, 8000), v)
	}
}

// TestSetKey: the bytes-keyed SET stores under a copy of the key (the
// caller's buffer is reused), overwrites, takes the empty key, and refuses
// a value over the limit as Set does.
func TestSetKey(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	s, err := Open(Config{RAMBytes: 1 << 20, MaxValue: 1000, Metrics: m})
	must.NoError(t, err)
	kb := []byte("k1")
	must.NoError(t, s.SetKey(kb, []byte("one")))
	kb[1] = '2' // the caller reuses its buffer
	must.NoError(t, s.SetKey(kb, []byte("two")))
	must.NoError(t, s.SetKey([]byte("k1"), []byte("uno")))
	must.NoError(t, s.SetKey([]byte{}, []byte("empty")))
	for k, want := range map[string]string{"k1": "uno", "k2": "two", "": "empty"} {
		v, _, ok := s.Get(context.Background(), k)
		must.True(t, ok)
		must.Eq(t, want, string(v))
	}
	must.Eq(t, 3, s.Len())
	var tl *ValueTooLargeError
	must.ErrorAs(t, s.SetKey([]byte("big"), make([]byte, 1001)), &tl)
	must.Eq(t, 1.0, promtest.ToFloat64(m.TooLarge))
}

// TestPooledBlockFilesAreReusedWhole: files of overwritten blocks are pooled
// and overwritten by later blocks of other sizes; every block reads back,
// the tier stays within its limit, and the files have exactly their
// header's length (what crash recovery checks: here the whole index is
// lost and every block is recovered from its file alone).
func TestPooledBlockFilesAreReusedWhole(t *testing.T) {
	dir := t.TempDir()
	const limit = 200_000
	s, _ := open(t, dir, 1<<20, limit)
	sizes := []int{9000, 5000, 12000, 7000}
	for round := 0; round < 6; round++ {
		for k := 0; k < 4; k++ {
			// Each round rewrites every key with another key's size.
			_, err := s.Set(fmt.Sprint("key", k), val(round*4+k, sizes[(k+round)%4]), 0, SetAlways)
			must.NoError(t, err)
		}
		must.NoError(t, s.Flush(context.Background()))
		must.LessEq(t, int64(limit), s.Stats().DiskBytes)
	}
	pooled, err := os.ReadDir(filepath.Join(dir, "free"))
	must.NoError(t, err)
	must.Positive(t, len(pooled))
	s.disk.mu.Lock()
	recycled, inPool := s.disk.poolSeq, len(s.disk.pool)
	s.disk.mu.Unlock()
	must.Eq(t, inPool, len(pooled))
	must.Greater(t, uint64(inPool), recycled) // the others were reused
	must.NoError(t, s.Close())

	must.NoError(t, os.RemoveAll(filepath.Join(dir, "index")))
	s, m := open(t, dir, 1<<20, limit)
	defer s.Close()
	pooled, err = os.ReadDir(filepath.Join(dir, "free"))
	must.NoError(t, err)
	must.SliceEmpty(t, pooled)
	for k := 0; k < 4; k++ {
		v, tier, ok := s.Get(context.Background(), fmt.Sprint("key", k))
		must.True(t, ok)
		must.Eq(t, TierDisk, tier)
		must.Eq(t, val(5*4+k, sizes[(k+5)%4]), v)
	}
	must.Eq(t, 0.0, promtest.ToFloat64(m.Corrupt))
}

// TestUnindexedFileIsVerifiedBeforeRecovery: a block file without an index
// entry is re-indexed only if its header's seq names the file and its
// checksum matches: a file holding another block (a reused file after a
// power loss) or a torn mix of two with the right length is deleted.
func TestUnindexedFileIsVerifiedBeforeRecovery(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, 1<<20, 1<<20)
	for _, k := range []string{"other", "torn", "swap"} {
		_, err := s.Set(k, []byte(strings.Repeat("value of "+k[:4], 1000)), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(context.Background()))
	path := func(k string) string { return s.disk.path(s.disk.idx[k].seq) }
	other, torn, swap := path("other"), path("torn"), path("swap")
	must.NoError(t, s.disk.db.Delete(indexKey("torn"), nil))
	must.NoError(t, s.disk.db.Delete(indexKey("swap"), nil))
	must.NoError(t, s.Close())
	// torn: same length, the middle of the value from another block.
	f, err := os.OpenFile(torn, os.O_WRONLY, 0)
	must.NoError(t, err)
	_, err = f.WriteAt([]byte("value of othe"), 4000)
	must.NoError(t, err)
	must.NoError(t, f.Close())
	// swap: the whole of another block's file under this name.
	b, err := os.ReadFile(other)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(swap, b, 0o600))

	s2, m := open(t, dir, 1<<20, 1<<20)
	defer s2.Close()
	must.Eq(t, 1, s2.Stats().DiskBlocks)
	v, _, ok := s2.Get(context.Background(), "other")
	must.True(t, ok)
	must.Eq(t, strings.Repeat("value of othe", 1000), string(v))
	for _, k := range []string{"torn", "swap"} {
		_, _, ok := s2.Get(context.Background(), k)
		must.False(t, ok, must.Sprint(k))
	}
	for _, p := range []string{torn, swap} {
		_, err := os.Stat(p)
		must.ErrorIs(t, err, fs.ErrNotExist)
	}
	must.Eq(t, 0.0, promtest.ToFloat64(m.Corrupt))
}

// TestOverwriteInPlaceKeepsAccounting: a key rewritten with values of other
// sizes (its item reused) leaves the RAM tier's bytes and blocks exact, an
// expiry set by one SET is cleared by the next, and the disk gets the last
// value.
func TestOverwriteInPlaceKeepsAccounting(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, 1<<20, 1<<20)
	for i, n := range []int{5000, 100, 9000, 7000} {
		exp := int64(0)
		if i == 2 {
			exp = time.Now().Add(time.Hour).UnixNano()
		}
		_, err := s.Set("k", val(i, n), exp, SetAlways)
		must.NoError(t, err)
		st := s.Stats()
		must.Eq(t, int64(n), st.RAMBytes)
		must.Eq(t, 1, st.RAMBlocks)
	}
	at, ok := s.ExpireAt("k")
	must.True(t, ok)
	must.Eq(t, int64(0), at)
	must.NoError(t, s.Flush(context.Background()))
	must.NoError(t, s.Close())
	s, _ = open(t, dir, 1<<20, 1<<20)
	defer s.Close()
	v, _, ok := s.Get(context.Background(), "k")
	must.True(t, ok)
	must.Eq(t, val(3, 7000), v)
}

// TestConcurrentPutsShareThePoolSafely: disk writes from several goroutines
// (the spiller and evicting requests write concurrently) take and return
// pooled files without two writes getting one file: every key reads back
// its last value, and every file is either named by the index or pooled.
func TestConcurrentPutsShareThePoolSafely(t *testing.T) {
	dir := t.TempDir()
	d, _, err := openDisk(dir, 1<<30, hclog.NewNullLogger(), NewMetrics(prometheus.NewRegistry()), nil)
	must.NoError(t, err)
	defer d.close()
	const writers, keys, rounds = 4, 8, 40
	var seq atomic.Uint64
	var wg sync.WaitGroup
	last := make([][keys]uint64, writers)
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				for k := 0; k < keys; k++ {
					n := seq.Add(1)
					key := fmt.Sprintf("w%d-k%d", w, k)
					must.NoError(t, d.put(key, val(int(n), 5000+int(n%7)*100), 0, n))
					last[w][k] = n
				}
			}
		}()
	}
	wg.Wait()
	for w := 0; w < writers; w++ {
		for k := 0; k < keys; k++ {
			n := last[w][k]
			v, _, ok, err := d.get(fmt.Sprintf("w%d-k%d", w, k), 0)
			must.NoError(t, err)
			must.True(t, ok)
			must.Eq(t, val(int(n), 5000+int(n%7)*100), v)
		}
	}
	blocks := 0
	must.NoError(t, filepath.WalkDir(filepath.Join(dir, "blocks"), func(_ string, de fs.DirEntry, err error) error {
		if err == nil && !de.IsDir() {
			blocks++
		}
		return err
	}))
	pooled, err := os.ReadDir(filepath.Join(dir, "free"))
	must.NoError(t, err)
	d.mu.Lock()
	must.Eq(t, len(d.idx), blocks)
	must.Eq(t, len(d.pool), len(pooled))
	d.mu.Unlock()
}

// TestKillKeepsIndexWritesOnceSynced simulates kill -9 by copying the data
// directory of a store that is still open: the copy holds what the kernel
// had, which is what survives the process. Values kept inline in the index
// (LMCache's 28-byte metadata) and deletions exist only as Pebble WAL
// records, which Pebble keeps in its own memory until a 32 KiB log block
// fills unless a sync asks for them: without walSyncer a kill lost every one
// written since the last full block, however long ago.
func TestKillKeepsIndexWritesOnceSynced(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, 1<<20, 1<<20)
	defer s.Close()
	meta := []byte("28 bytes of chunk metadata..")
	for _, k := range []string{"a@metadata", "b@metadata", "gone@metadata"} {
		_, err := s.Set(k, meta, 0, SetAlways)
		must.NoError(t, err)
	}
	_, err := s.Set("a@kv_bytes", val(7, 64<<10), 0, SetAlways)
	must.NoError(t, err)
	must.NoError(t, s.Flush(context.Background()))
	keysAfterKill(t, dir, "a@kv_bytes", "a@metadata", "b@metadata", "gone@metadata")

	// A deletion is an index write too: a kill must not bring the key back.
	must.True(t, s.Delete("gone@metadata"))
	keysAfterKill(t, dir, "a@kv_bytes", "a@metadata", "b@metadata")
}

// keysAfterKill waits until a copy of a live store's directory, opened as a
// store, holds exactly the keys want, for at most a second: the WAL is synced
// walSyncDelay after a write, and the margin is for a loaded machine.
func keysAfterKill(t *testing.T, dir string, want ...string) {
	t.Helper()
	start := time.Now()
	// ErrorFunc: a failure shows the keys the last copy held.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		crashed := filepath.Join(t.TempDir(), "crashed")
		copyDir(t, dir, crashed)
		s, _ := open(t, crashed, 1<<20, 1<<20)
		keys := s.Keys()
		must.NoError(t, s.Close())
		if !slices.Equal(want, keys) {
			return fmt.Errorf("keys a kill leaves %s after the writes: %v, want %v", time.Since(start), keys, want)
		}
		return nil
	}), wait.Timeout(time.Second), wait.Gap(walSyncDelay)))
}

// copyDir copies the regular files under src to dst.
func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	err := filepath.WalkDir(src, func(path string, de fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if de.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o700)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o600)
	})
	must.NoError(t, err)
}
