package prefixindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"
	"time"
)

// The workload: 64 workers, 1M indexed blocks, 256-block prompts.
// 4700 prompts of 256 chained blocks (1,052,832 distinct digests); each prompt
// is held by one worker in GPU, and the first 32 blocks (a shared system
// prompt) by every worker that holds any prompt, so the first positions have
// many holders as in real traffic.
const (
	benchWorkers = 64
	benchPrompts = 4700
	benchBlocks  = 256
)

var sharedBlocks = 32

func benchPromptDigests(p int) []uint64 {
	ds := make([]uint64, benchBlocks)
	for i := range ds {
		if i < sharedBlocks {
			ds[i] = uint64(i + 1) // shared prefix
			continue
		}
		ds[i] = rand.New(rand.NewPCG(uint64(p), uint64(i))).Uint64()
	}
	return ds
}

func buildBenchIndex(tb testing.TB) (*Index, [][]uint64) {
	tb.Helper()
	ix := New(Config{})
	for w := 0; w < benchWorkers; w++ {
		if err := ix.AddWorker(fmt.Sprintf("worker-%02d", w), 0); err != nil {
			tb.Fatal(err)
		}
	}
	prompts := make([][]uint64, benchPrompts)
	for p := range prompts {
		prompts[p] = benchPromptDigests(p)
		if err := ix.Store(fmt.Sprintf("worker-%02d", p%benchWorkers), TierGPU, prompts[p], 0); err != nil {
			tb.Fatal(err)
		}
	}
	return ix, prompts
}

// BenchmarkMatch measures one routing decision's index lookup (tokenization
// and digesting excluded) and reports p50/p99 latency.
func BenchmarkMatch(b *testing.B) {
	ix, prompts := buildBenchIndex(b)
	benchMatch(b, ix, prompts)
}

// BenchmarkMatchShuffledSlab is BenchmarkMatch after most prompts were
// removed block by block in random order and stored again, so their nodes
// come off the free list scattered: the adversarial layout for Match's walk
// along adjacent nodes, which then falls back to table lookups.
func BenchmarkMatchShuffledSlab(b *testing.B) {
	ix, prompts := buildBenchIndex(b)
	rng := rand.New(rand.NewPCG(11, 12))
	for round := 0; round < benchPrompts/2; round++ {
		ps := []int{rng.IntN(len(prompts)), rng.IntN(len(prompts))}
		for _, p := range ps {
			unique := slices.Clone(prompts[p][sharedBlocks:])
			rng.Shuffle(len(unique), func(i, j int) { unique[i], unique[j] = unique[j], unique[i] })
			for _, d := range unique {
				if err := ix.Remove(fmt.Sprintf("worker-%02d", p%benchWorkers), 0, []uint64{d}, nil); err != nil {
					b.Fatal(err)
				}
			}
		}
		for _, p := range ps {
			if err := ix.Store(fmt.Sprintf("worker-%02d", p%benchWorkers), TierGPU, prompts[p], 0); err != nil {
				b.Fatal(err)
			}
		}
	}
	benchMatch(b, ix, prompts)
}

func benchMatch(b *testing.B, ix *Index, prompts [][]uint64) {
	rng := rand.New(rand.NewPCG(7, 7))
	out := make([]Match, 0, benchWorkers)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		p := prompts[rng.IntN(len(prompts))]
		t0 := time.Now()
		out = ix.Match(p, DefaultTierWeights(), out[:0])
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	if len(out) == 0 {
		b.Fatal("no match")
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkStore measures event ingest: blocks stored per second on one core,
// in event-sized batches of 16 blocks into a warm 1M-entry index with
// capacity eviction active.
func BenchmarkStore(b *testing.B) {
	ix := New(Config{})
	const perWorker = (1 << 20) / benchWorkers
	for w := 0; w < benchWorkers; w++ {
		_ = ix.AddWorker(fmt.Sprintf("worker-%02d", w), perWorker)
	}
	ids := make([]string, benchWorkers)
	for w := range ids {
		ids[w] = fmt.Sprintf("worker-%02d", w)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	batch := make([]uint64, 16)
	fill := func() {
		for j := range batch {
			batch[j] = rng.Uint64()
		}
	}
	for i := 0; i < (1<<20)/16; i++ {
		fill()
		_ = ix.Store(ids[i%benchWorkers], TierGPU, batch, 0)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		fill()
		_ = ix.Store(ids[i%benchWorkers], TierGPU, batch, 0)
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*len(batch))/b.Elapsed().Seconds(), "blocks/s")
}

// TestBytesPerEntry measures the heap the index holds per (block, worker)
// entry with 1M entries and keeps it within the 64-byte budget.
func TestBytesPerEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 1M-entry index")
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	// The prompts are part of the workload, not of the index: measured with them alive they
	// are in both snapshots and cancel out.
	ix, prompts := buildBenchIndex(t)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(prompts)
	st := ix.Stats()
	// The prompts slice (8 bytes per block) is live during the measurement;
	// subtract it.
	heap := int64(after.HeapAlloc) - int64(before.HeapAlloc) - benchPrompts*benchBlocks*8
	per := float64(heap) / float64(st.Entries)
	t.Logf("entries=%d digests=%d heap=%d bytes/entry=%.1f estimate=%d", st.Entries, st.Digests, heap, per, st.Bytes)
	if per > 64 {
		t.Fatalf("%.1f bytes per entry, budget 64", per)
	}
	runtime.KeepAlive(ix)
}
