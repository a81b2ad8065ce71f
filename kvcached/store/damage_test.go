package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"
)

// fillIndex writes inline values and block files and flushes Pebble's
// memtable, so the index has an SST, then closes the store.
func fillIndex(t *testing.T, dir string) {
	t.Helper()
	s, _ := open(t, dir, 1<<20, 1<<30)
	for i := 0; i < 50; i++ {
		_, err := s.Set(fmt.Sprint("meta", i), val(i, 28), 0, SetAlways)
		must.NoError(t, err)
		_, err = s.Set(fmt.Sprint("block", i), val(i, 10000), 0, SetAlways)
		must.NoError(t, err)
	}
	must.NoError(t, s.Flush(context.Background()))
	must.NoError(t, s.disk.db.Flush())
	must.NoError(t, s.Close())
}

// damageIndex damages <dir>/index the way kind says and fails the test if
// there was nothing to damage.
func damageIndex(t *testing.T, dir, kind string) {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "index"))
	must.NoError(t, err)
	done := false
	for _, e := range ents {
		p := filepath.Join(dir, "index", e.Name())
		switch {
		case kind == "flipped byte in an SST" && strings.HasSuffix(e.Name(), ".sst"):
			b, err := os.ReadFile(p)
			must.NoError(t, err)
			b[len(b)/3] ^= 0x01
			must.NoError(t, os.WriteFile(p, b, 0o600))
		case kind == "empty MANIFEST" && strings.HasPrefix(e.Name(), "MANIFEST-"):
			must.NoError(t, os.Truncate(p, 0))
		case kind == "missing SST" && strings.HasSuffix(e.Name(), ".sst"):
			must.NoError(t, os.Remove(p))
		default:
			continue
		}
		done = true
	}
	must.True(t, done, must.Sprintf("no file to damage for %q", kind))
}

// A damaged index (each kind an operator meets after a bad disk or a crash
// mid-copy) must not keep the store from opening: it is moved aside, one
// such copy is kept, the disk tier starts empty, and it is counted.
func TestDamagedIndexIsMovedAsideAndTheStoreStartsEmpty(t *testing.T) {
	for _, kind := range []string{"flipped byte in an SST", "empty MANIFEST", "missing SST"} {
		t.Run(kind, func(t *testing.T) {
			dir := t.TempDir()
			ctx := context.Background()
			var first string
			for round := 0; round < 2; round++ {
				fillIndex(t, dir)
				damageIndex(t, dir, kind)
				m := NewMetrics(prometheus.NewRegistry())
				s, err := Open(Config{RAMBytes: 1 << 20, DiskBytes: 1 << 30, Dir: dir, Metrics: m, MaxValue: 1 << 20})
				must.NoError(t, err)
				must.Eq(t, 1.0, promtest.ToFloat64(m.IndexDamaged))
				must.Eq(t, 0, s.Stats().DiskBlocks)
				_, _, ok := s.Get(ctx, "block1")
				must.False(t, ok)
				aside, err := filepath.Glob(filepath.Join(dir, "index.damaged-*"))
				must.NoError(t, err)
				must.Len(t, 1, aside, must.Sprint("one damaged copy is kept"))
				must.NotEq(t, first, aside[0])
				first = aside[0]
				// The damaged files are what was moved aside.
				_, err = os.Stat(filepath.Join(aside[0], "CURRENT"))
				must.NoError(t, err)
				blocks := 0
				filepath.WalkDir(filepath.Join(dir, "blocks"), func(_ string, de os.DirEntry, _ error) error {
					if de != nil && !de.IsDir() {
						blocks++
					}
					return nil
				})
				must.Eq(t, 0, blocks, must.Sprint("the damaged index's block files are dropped"))

				// The new index works, across a restart too.
				_, err = s.Set("after", val(7, 10000), 0, SetAlways)
				must.NoError(t, err)
				_, err = s.Set("small", val(8, 28), 0, SetAlways)
				must.NoError(t, err)
				must.NoError(t, s.Flush(ctx))
				must.NoError(t, s.Close())
				s2, m2 := open(t, dir, 1<<20, 1<<30)
				must.Eq(t, 0.0, promtest.ToFloat64(m2.IndexDamaged))
				for k, want := range map[string][]byte{"after": val(7, 10000), "small": val(8, 28)} {
					v, _, ok := s2.Get(ctx, k)
					must.True(t, ok, must.Sprint(k))
					must.Eq(t, want, v)
				}
				must.NoError(t, s2.Close())
			}
		})
	}
}

// An index another opener holds is not damage: the second Open fails and
// leaves the index where it is.
func TestLockedIndexIsNotTreatedAsDamage(t *testing.T) {
	dir := t.TempDir()
	s, _ := open(t, dir, 1<<20, 1<<30)
	defer s.Close()
	_, err := s.Set("k", val(1, 28), 0, SetAlways)
	must.NoError(t, err)
	m := NewMetrics(prometheus.NewRegistry())
	_, err = Open(Config{RAMBytes: 1 << 20, DiskBytes: 1 << 30, Dir: dir, Metrics: m})
	must.ErrorContains(t, err, "locking disk index")
	must.Eq(t, 0.0, promtest.ToFloat64(m.IndexDamaged))
	aside, _ := filepath.Glob(filepath.Join(dir, "index.damaged-*"))
	must.Len(t, 0, aside)
	v, _, ok := s.Get(context.Background(), "k")
	must.True(t, ok)
	must.Eq(t, val(1, 28), v)
}
