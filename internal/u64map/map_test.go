package u64map

import (
	"math/rand/v2"
	"testing"

	"github.com/shoenig/test/must"
)

// TestAgainstGoMap runs random puts, overwrites and deletes (small key space:
// long probe runs, wrap-around shifts, growth) against a Go map.
func TestAgainstGoMap(t *testing.T) {
	type digest [32]byte
	rng := rand.New(rand.NewPCG(5, 6))
	m := New[digest]()
	ref := map[uint64]digest{}
	for step := range 100_000 {
		k := rng.Uint64N(5000)
		if rng.IntN(4) == 0 {
			k = rng.Uint64() // wide keys too
		}
		switch rng.IntN(3) {
		case 0, 1:
			var d digest
			d[0], d[31] = byte(step), 1 // never zero
			m.Put(k, d)
			ref[k] = d
		default:
			m.Delete(k)
			delete(ref, k)
		}
		if step%10_000 == 0 {
			must.Eq(t, len(ref), m.Len())
			for k, want := range ref {
				got, ok := m.Get(k)
				must.True(t, ok, must.Sprintf("step %d key %d", step, k))
				must.Eq(t, want, got)
			}
		}
	}
	for k := range uint64(5000) {
		_, ok := m.Get(k)
		_, want := ref[k]
		must.Eq(t, want, ok)
	}
}

func TestZeroValueIsNotStored(t *testing.T) {
	m := New[int32]()
	m.Put(7, 0)
	_, ok := m.Get(7)
	must.False(t, ok)
	must.Eq(t, 0, m.Len())
	m.Put(7, 3)
	m.Warm([]uint64{7, 8})
	v, ok := m.Get(7)
	must.True(t, ok)
	must.Eq(t, int32(3), v)
	m.Reset()
	must.Eq(t, 0, m.Len())
	_, ok = m.Get(7)
	must.False(t, ok)
}
