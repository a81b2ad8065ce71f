package prefixindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shoenig/test/must"
)

// ms is a Store time of t milliseconds.
func ms(t int) int64 { return int64(t) * 1e6 }

// Each worker's capacity is far above the budget: the budget alone bounds
// the index, and it evicts the least recently stored entry of any worker.
func TestBudgetEvictsLeastRecentAcrossWorkers(t *testing.T) {
	evicted := 0
	ix := New(Config{MaxEntries: 4, OnBudgetEvict: func(n int) { evicted += n }})
	must.NoError(t, ix.AddWorker("a", 1<<20))
	must.NoError(t, ix.AddTieredWorker("b", Capacity{GPU: 1 << 20}))
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 2}, ms(1)))
	must.NoError(t, ix.Store("b", TierGPU, []uint64{3, 4}, ms(2)))
	must.Eq(t, 0, evicted)

	steps := []struct {
		worker string
		digest uint64
		gone   uint64 // the entry the store evicts
		owner  string
	}{
		{"a", 5, 1, "a"},
		{"b", 6, 2, "a"},
		{"a", 7, 3, "b"},
		{"a", 8, 4, "b"},
	}
	for i, s := range steps {
		must.NoError(t, ix.Store(s.worker, TierGPU, []uint64{s.digest}, ms(3+i)))
		must.Eq(t, 0, ix.Holds(s.owner, s.gone), must.Sprintf("step %d", i))
		must.Eq(t, TierGPU, ix.Holds(s.worker, s.digest), must.Sprintf("step %d", i))
		must.Eq(t, 4, ix.Stats().Entries)
	}
	must.Eq(t, 4, evicted)
	must.Eq(t, uint64(4), ix.Stats().BudgetEvictions)
	// Refreshing an entry makes it the most recent: the next eviction takes
	// the oldest other one (b's 6, stored at 4 ms).
	must.NoError(t, ix.Store("a", TierGPU, []uint64{5}, ms(10)))
	must.NoError(t, ix.Store("a", TierGPU, []uint64{9}, ms(11)))
	must.Eq(t, 0, ix.Holds("b", 6))
	must.Eq(t, TierGPU, ix.Holds("a", 5))
	// A shared digest is one entry per holder.
	must.NoError(t, ix.Store("b", TierGPU, []uint64{9}, ms(12)))
	must.Eq(t, 4, ix.Stats().Entries)
	must.Eq(t, TierGPU, ix.Holds("a", 9))
	must.Eq(t, TierGPU, ix.Holds("b", 9))
}

// Stores at one instant (the same stamp everywhere) evict from the worker
// holding the most, so the budget is shared rather than one worker emptied.
func TestBudgetTiesEvictTheLargest(t *testing.T) {
	ix := newIndex(t, Config{MaxEntries: 8}, "a", "b")
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 2, 3, 4, 5, 6}, 0))
	must.NoError(t, ix.Store("b", TierGPU, []uint64{11, 12}, 0))
	must.NoError(t, ix.Store("b", TierGPU, []uint64{13, 14, 15, 16}, 0))
	must.Eq(t, 4, ix.WorkerEntries("a"))
	must.Eq(t, 4, ix.WorkerEntries("b"))
}

// A budgeted index against a model of one LRU order across workers, each
// also bounded by its own capacity: stores (new and refreshed entries),
// removals, clears, and workers leaving and coming back.
func TestBudgetAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const budget, keys = 300, 500
	ix := New(Config{MaxEntries: budget})
	workers := []string{"w0", "w1", "w2", "w3", "w4", "w5"}
	caps := map[string]int{}
	type entry struct {
		worker string
		digest uint64
	}
	var order []entry // least recent first
	count := func(w string) int {
		n := 0
		for _, e := range order {
			if e.worker == w {
				n++
			}
		}
		return n
	}
	drop := func(i int) { order = slices.Delete(order, i, i+1) }
	find := func(w string, d uint64) int {
		return slices.Index(order, entry{w, d})
	}
	for _, w := range workers {
		caps[w] = 20 + rng.IntN(200)
		must.NoError(t, ix.AddWorker(w, caps[w]))
	}
	evictions := 0
	for step := 1; step < 20000; step++ {
		w := workers[rng.IntN(len(workers))]
		switch r := rng.IntN(100); {
		case r < 80:
			batch := make([]uint64, 1+rng.IntN(8))
			for i := range batch {
				batch[i] = uint64(rng.IntN(keys))
			}
			must.NoError(t, ix.Store(w, TierGPU, batch, ms(step)))
			for _, d := range batch {
				if i := find(w, d); i >= 0 {
					drop(i)
				} else if count(w) >= caps[w] {
					drop(slices.IndexFunc(order, func(e entry) bool { return e.worker == w }))
				} else if len(order) >= budget {
					drop(0)
					evictions++
				}
				order = append(order, entry{w, d})
			}
		case r < 92:
			d := uint64(rng.IntN(keys))
			must.NoError(t, ix.Remove(w, 0, []uint64{d}, nil))
			if i := find(w, d); i >= 0 {
				drop(i)
			}
		case r < 94:
			_, err := ix.ClearWorker(w)
			must.NoError(t, err)
			order = slices.DeleteFunc(order, func(e entry) bool { return e.worker == w })
		case r < 96:
			ix.RemoveWorker(w)
			order = slices.DeleteFunc(order, func(e entry) bool { return e.worker == w })
			caps[w] = 20 + rng.IntN(200)
			must.NoError(t, ix.AddWorker(w, caps[w]))
		case r < 98:
			// Match agrees with the model, shared digests (wide records) included.
			req := make([]uint64, 1+rng.IntN(4))
			for i := range req {
				req[i] = uint64(rng.IntN(keys / 10))
			}
			got := matchesByWorker(ix.Match(req, DefaultTierWeights(), nil))
			for _, w := range workers {
				n := 0
				for n < len(req) && find(w, req[n]) >= 0 {
					n++
				}
				must.Eq(t, n, got[w].Blocks, must.Sprintf("step %d: %s %v", step, w, req))
			}
		default:
			for _, e := range order {
				must.Eq(t, TierGPU, ix.Holds(e.worker, e.digest), must.Sprintf("step %d: %s %d", step, e.worker, e.digest))
			}
			for _, w := range workers {
				must.Eq(t, count(w), ix.WorkerEntries(w), must.Sprintf("step %d: %s", step, w))
			}
		}
		st := ix.Stats()
		must.Eq(t, len(order), st.Entries, must.Sprintf("step %d", step))
		must.LessEq(t, budget, st.Entries)
		must.Eq(t, uint64(evictions), st.BudgetEvictions, must.Sprintf("step %d", step))
	}
	must.Greater(t, 1000, evictions)
}

// The budget bounds the index's memory whatever the workers' capacities:
// the slab never grows past the budget's nodes, nor the table past the
// size its digests need.
func TestBudgetBoundsMemory(t *testing.T) {
	const budget = 1 << 14
	ix := New(Config{MaxEntries: budget})
	for w := range 16 {
		must.NoError(t, ix.AddTieredWorker(fmt.Sprint("w", w), Capacity{GPU: MaxTierBlocks}))
	}
	rng := rand.New(rand.NewPCG(1, 1))
	batch := make([]uint64, 256)
	for i := range 1024 {
		for j := range batch {
			batch[j] = rng.Uint64()
		}
		must.NoError(t, ix.Store(fmt.Sprint("w", i%16), TierGPU, batch, ms(i)))
	}
	st := ix.Stats()
	must.Eq(t, budget, st.Entries)
	must.Eq(t, uint64(1024*256-budget), st.BudgetEvictions)
	// One slab chunk of nodes per 2^14, a table at most 4× the entries.
	must.LessEq(t, int64(2*chunkSize*28+4*budget*16+16*(8+64)+64), st.Bytes)
}
