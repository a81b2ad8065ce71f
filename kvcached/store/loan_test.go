package store

import (
	"bytes"
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"unsafe"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/kvcached/internal/bufpool"
)

const loanSize = bufpool.MinSize

func openPooled(t *testing.T, dir string, ram, disk int64) *Store {
	t.Helper()
	s, err := Open(Config{RAMBytes: ram, DiskBytes: disk, Dir: dir, Metrics: NewMetrics(prometheus.NewRegistry()),
		MaxValue: 1 << 20, PoolBytes: 8 * loanSize})
	must.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// pooledVal fills a buffer from the store's pool, as the RESP reader does.
func pooledVal(s *Store, b byte) []byte {
	v := s.BufferPool().Get(loanSize)
	for i := range v {
		v[i] = b
	}
	return v
}

func sameBuf(a, b []byte) bool { return unsafe.SliceData(a) == unsafe.SliceData(b) }

// mustBeIntact checks v still holds byte b throughout and that none of the
// next buffers the pool hands out is v's memory.
func mustBeIntact(t *testing.T, s *Store, v []byte, b byte) {
	t.Helper()
	for i := 0; i < 8; i++ {
		must.False(t, sameBuf(v, s.BufferPool().Get(loanSize)))
	}
	must.True(t, bytes.Equal(v, bytes.Repeat([]byte{b}, loanSize)))
}

func TestReleasedValueIsReusedAfterOverwrite(t *testing.T) {
	s := openPooled(t, "", 1<<20, 0)
	ctx := context.Background()
	first := pooledVal(s, 1)
	must.NoError(t, s.SetKey([]byte("k"), first))
	v, loan, _, ok := s.Borrow(ctx, "k")
	must.True(t, ok)
	must.True(t, sameBuf(first, v))
	s.Release(loan)
	must.NoError(t, s.SetKey([]byte("k"), pooledVal(s, 2)))
	must.Eq(t, int64(loanSize), s.BufferPool().Held())
	must.Eq(t, float64(loanSize), promtest.ToFloat64(s.cfg.Metrics.PoolBytes))
	must.True(t, sameBuf(first, s.BufferPool().Get(loanSize)), must.Sprint("the overwritten value's buffer is what the next SET gets"))
}

// Every way a key lets its value go while the value is out on a loan, or was
// handed out by Get, must leave the bytes alone.
func TestValueOnLoanOrSharedIsNeverReused(t *testing.T) {
	ctx := context.Background()
	let := map[string]func(s *Store){
		"overwritten": func(s *Store) { must.NoError(t, s.SetKey([]byte("k"), pooledVal(s, 9))) },
		"deleted":     func(s *Store) { must.True(t, s.Delete("k")) },
		"evicted": func(s *Store) {
			// RAM holds two values: two newer keys push k out.
			for _, k := range []string{"a", "b"} {
				must.NoError(t, s.SetKey([]byte(k), pooledVal(s, 9)))
			}
		},
	}
	take := map[string]func(s *Store) (v []byte, done func()){
		"borrowed, not yet released": func(s *Store) ([]byte, func()) {
			v, loan, _, ok := s.Borrow(ctx, "k")
			must.True(t, ok)
			return v, func() { s.Release(loan) }
		},
		"got (never given back)": func(s *Store) ([]byte, func()) {
			v, _, ok := s.Get(ctx, "k")
			must.True(t, ok)
			return v, func() {}
		},
	}
	for ln, letGo := range let {
		for tn, takeIt := range take {
			t.Run(ln+"/"+tn, func(t *testing.T) {
				s := openPooled(t, "", 2*loanSize, 0)
				must.NoError(t, s.SetKey([]byte("k"), pooledVal(s, 1)))
				v, done := takeIt(s)
				letGo(s)
				mustBeIntact(t, s, v, 1)
				done()
				must.Eq(t, int64(0), s.BufferPool().Held(), must.Sprint("a value let go while lent is left to the GC"))
			})
		}
	}
}

func TestStaleReleaseLeavesTheNewValueLent(t *testing.T) {
	s := openPooled(t, "", 1<<20, 0)
	ctx := context.Background()
	must.NoError(t, s.SetKey([]byte("k"), pooledVal(s, 1)))
	_, old, _, _ := s.Borrow(ctx, "k")
	must.NoError(t, s.SetKey([]byte("k"), pooledVal(s, 2)))
	v2, cur, _, _ := s.Borrow(ctx, "k")
	s.Release(old) // a loan of the value before: must not end cur's
	must.NoError(t, s.SetKey([]byte("k"), pooledVal(s, 3)))
	mustBeIntact(t, s, v2, 2)
	s.Release(cur)
}

func TestPromotedBlockIsLentToItsReader(t *testing.T) {
	dir := t.TempDir()
	s := openPooled(t, dir, 2*loanSize, 8*loanSize)
	ctx := context.Background()
	for i, k := range []string{"k", "a", "b"} {
		must.NoError(t, s.SetKey([]byte(k), pooledVal(s, byte(i+1))))
		must.NoError(t, s.Flush(ctx))
	}
	// k was evicted to disk; reading it promotes it into RAM.
	v, loan, tier, ok := s.Borrow(ctx, "k")
	must.True(t, ok)
	must.Eq(t, TierDisk, tier)
	must.NoError(t, s.SetKey([]byte("k"), pooledVal(s, 7)))
	mustBeIntact(t, s, v, 1)
	s.Release(loan)
}

// Writers rewrite a few keys with values whose every byte names the write;
// readers borrow and check each value is one write's, whole, until released.
// Run with -race: it also checks the loans' bookkeeping is under the lock.
func TestLoansUnderConcurrentRewrites(t *testing.T) {
	dir := t.TempDir()
	s := openPooled(t, dir, 6*loanSize, 64*loanSize)
	ctx := context.Background()
	keys := []string{"k0", "k1", "k2", "k3", "k4", "k5", "k6", "k7"}
	stop := make(chan struct{})
	var writers, readers sync.WaitGroup
	for w := 0; w < 3; w++ {
		writers.Add(1)
		go func(w int) {
			defer writers.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if err := s.SetKey([]byte(keys[(i+w)%len(keys)]), pooledVal(s, byte(i*3+w))); err != nil {
					t.Error(err)
					return
				}
				if i%50 == 0 {
					s.Delete(keys[i%len(keys)])
				}
			}
		}(w)
	}
	var torn, read atomic.Int64
	for r := 0; r < 3; r++ {
		readers.Add(1)
		go func(r int) {
			defer readers.Done()
			for i := 0; i < 3000; i++ {
				v, loan, _, ok := s.Borrow(ctx, keys[(i+r)%len(keys)])
				if !ok {
					continue
				}
				read.Add(1)
				if !bytes.Equal(v, bytes.Repeat(v[:1], len(v))) {
					torn.Add(1)
				}
				s.Release(loan)
			}
		}(r)
	}
	readers.Wait()
	close(stop)
	writers.Wait()
	must.Eq(t, int64(0), torn.Load())
	must.Greater(t, int64(1000), read.Load())
}
