package cachestate

import (
	"math/rand/v2"
	"testing"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/shoenig/test/must"
)

func TestHashMapAgainstMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	m := newHashMap()
	ref := map[uint64]blockdigest.Digest{}
	for step := 0; step < 60000; step++ {
		k := uint64(rng.IntN(5000))
		if rng.IntN(4) == 0 {
			k = rng.Uint64() // wide keys too
		}
		switch rng.IntN(3) {
		case 0, 1:
			d := blockdigest.FromUint64s(rng.Uint64(), k)
			m.put(k, d)
			ref[k] = d
		default:
			m.del(k)
			delete(ref, k)
		}
		if step%10000 == 0 {
			for k, want := range ref {
				if got, ok := m.get(k); !ok || got != want {
					t.Fatalf("step %d key %d: got %v %v, want %v", step, k, got, ok, want)
				}
			}
		}
	}
	must.Eq(t, len(ref), m.len())
	for k := uint64(0); k < 5000; k++ {
		_, ok := m.get(k)
		_, want := ref[k]
		must.Eq(t, want, ok)
	}
}
