package store

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
	"lukechampine.com/blake3"
)

// TestBlockSumIsBLAKE3: blockSum gives what the library's hasher gives for
// key then value, for lengths around every chunk and SIMD-group boundary
// and for keys of every length class.
func TestBlockSumIsBLAKE3(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	data := make([]byte, 1<<20+3000)
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	want := readSum // the library's own Hasher over key then value
	keys := []string{"", "k", "key:000000000123", strings.Repeat("x", 1023), strings.Repeat("y", 1024), strings.Repeat("z", 1500)}
	lengths := []int{0, 1, 63, 64, 1000, 1007, 1008, 1023, 1024, 1025, 2047, 2048, 2049, 15 * 1024, 16*1024 - 17,
		16 * 1024, 16*1024 + 1, 17 * 1024, 31*1024 + 5, 32 * 1024, 33 * 1024, 100_000, 1 << 20, 1<<20 + 1, 1<<20 + 3000}
	for range 20 {
		lengths = append(lengths, rng.IntN(len(data)))
	}
	for _, k := range keys {
		for _, n := range lengths {
			must.Eq(t, want(k, data[:n]), blockSum(k, data[:n]), must.Sprintf("key %d bytes, value %d bytes", len(k), n))
		}
	}
}

func BenchmarkBlockSum1MiB(b *testing.B) {
	val := make([]byte, 1<<20)
	b.SetBytes(int64(len(val)))
	for b.Loop() {
		blockSum("key:000000000123", val)
	}
}

func BenchmarkLibraryHasher1MiB(b *testing.B) {
	val := make([]byte, 1<<20)
	b.SetBytes(int64(len(val)))
	var sum [32]byte
	for b.Loop() {
		h := blake3.New(32, nil)
		h.Write([]byte("key:000000000123"))
		h.Write(val)
		h.Sum(sum[:0])
	}
}
