package prefixindex

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"sync"
	"testing"
	"unsafe"

	"github.com/shoenig/test/must"
)

func matchesByWorker(ms []Match) map[string]Match {
	out := make(map[string]Match, len(ms))
	for _, m := range ms {
		out[m.Worker] = m
	}
	return out
}

func newIndex(t *testing.T, cfg Config, workers ...string) *Index {
	t.Helper()
	ix := New(cfg)
	for _, w := range workers {
		must.NoError(t, ix.AddWorker(w, 0))
	}
	return ix
}

func TestMatchLongestPrefixPerWorker(t *testing.T) {
	ix := newIndex(t, Config{}, "a", "b", "c")
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 2, 3, 4}, 0))
	must.NoError(t, ix.Store("b", TierGPU, []uint64{1, 2}, 0))
	must.NoError(t, ix.Store("c", TierGPU, []uint64{9}, 0))

	cases := []struct {
		name    string
		request []uint64
		want    map[string]int
	}{
		{"full on a", []uint64{1, 2, 3, 4, 5}, map[string]int{"a": 4, "b": 2}},
		{"short request", []uint64{1}, map[string]int{"a": 1, "b": 1}},
		{"no first block", []uint64{7, 2, 3}, map[string]int{}},
		{"other prefix", []uint64{9, 10}, map[string]int{"c": 1}},
		{"empty", nil, map[string]int{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got := matchesByWorker(ix.Match(tc.request, DefaultTierWeights(), nil))
			must.MapLen(t, len(tc.want), got)
			for w, blocks := range tc.want {
				must.Eq(t, blocks, got[w].Blocks, must.Sprintf("worker %s", w))
				must.Eq(t, float64(blocks), got[w].Weighted)
				must.Eq(t, blocks, got[w].GPUBlocks)
			}
		})
	}
}

// A worker holding a later block but missing an earlier one matches only up
// to the gap: a block counts only at a position the worker holds a prefix to.
func TestMatchStopsAtGap(t *testing.T) {
	ix := newIndex(t, Config{}, "a", "b")
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 3, 4}, 0)) // lacks 2
	must.NoError(t, ix.Store("b", TierGPU, []uint64{2, 3, 4}, 0)) // lacks 1
	got := matchesByWorker(ix.Match([]uint64{1, 2, 3, 4}, DefaultTierWeights(), nil))
	must.MapLen(t, 1, got)
	must.Eq(t, 1, got["a"].Blocks)
}

// Capacity eviction drops a worker's least recently stored blocks, which for a
// chain stored in order are its first ones: the worker keeps later blocks
// behind a hole. Match checks every position, so the hole ends the match.
func TestMatchStopsAtEvictionHole(t *testing.T) {
	ix := New(Config{})
	must.NoError(t, ix.AddWorker("a", 4))
	must.NoError(t, ix.AddWorker("b", 0))
	chain := []uint64{11, 12, 13, 14, 15, 16}
	must.NoError(t, ix.Store("a", TierGPU, chain, 0)) // evicts 11 and 12
	must.NoError(t, ix.Store("b", TierGPU, chain[:3], 0))
	must.Eq(t, 0, ix.Holds("a", 11))
	must.Eq(t, TierGPU, ix.Holds("a", 16))
	got := matchesByWorker(ix.Match(chain, DefaultTierWeights(), nil))
	must.MapLen(t, 1, got)
	must.Eq(t, 3, got["b"].Blocks)

	// A hole in the middle (a lost or partial removal) ends it there too.
	must.NoError(t, ix.Remove("b", 0, chain[1:2], nil))
	must.NoError(t, ix.Store("b", TierGPU, chain[3:], 0))
	got = matchesByWorker(ix.Match(chain, DefaultTierWeights(), nil))
	must.Eq(t, 1, got["b"].Blocks)
}

// The table and node layouts are what the memory budget and the one-miss
// lookup rest on.
func TestLayoutSizes(t *testing.T) {
	must.Eq(t, 28, int(unsafe.Sizeof(node{})))
	must.Eq(t, 16, int(unsafe.Sizeof(slot{})))
	must.Eq(t, 64, bucketSlots*int(unsafe.Sizeof(slot{})))
}

// Digests that collide on their home bucket overflow into the next buckets;
// Match and Holds must find them, and find digest 0, whose key equals an
// empty slot's.
func TestBucketOverflow(t *testing.T) {
	ix := newIndex(t, Config{}, "a", "b")
	// Find 9 digests sharing one home bucket.
	var same []uint64
	home := ix.home(0)
	for d := uint64(0); len(same) < 9; d++ {
		if ix.home(d) == home {
			same = append(same, d)
		}
	}
	must.Eq(t, uint64(0), same[0])
	must.NoError(t, ix.Store("a", TierGPU, same, 0))
	got := matchesByWorker(ix.Match(same, DefaultTierWeights(), nil))
	must.Eq(t, len(same), got["a"].Blocks)
	// Delete from the front: backward shifts move the overflowed ones home.
	must.NoError(t, ix.Remove("a", 0, same[:2], nil))
	must.NoError(t, ix.Store("b", TierCPU, same[2:], 0))
	got = matchesByWorker(ix.Match(same[2:], DefaultTierWeights(), nil))
	must.Eq(t, len(same)-2, got["a"].Blocks)
	must.Eq(t, len(same)-2, got["b"].Blocks)
	must.Eq(t, 0, got["b"].GPUBlocks)
	must.SliceEmpty(t, ix.Match(same, DefaultTierWeights(), nil))
}

func TestMatchTierWeights(t *testing.T) {
	ix := newIndex(t, Config{}, "a")
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1}, 0))
	must.NoError(t, ix.Store("a", TierCPU, []uint64{1, 2}, 0))
	must.NoError(t, ix.Store("a", TierDisk, []uint64{3}, 0))
	must.NoError(t, ix.Store("a", TierPeer, []uint64{4}, 0))
	w := TierWeights{GPU: 1, CPU: 0.75, Disk: 0.25, Peer: 0.5}
	m := ix.Match([]uint64{1, 2, 3, 4}, w, nil)
	must.SliceLen(t, 1, m)
	must.Eq(t, 4, m[0].Blocks)
	must.Eq(t, 1, m[0].GPUBlocks)
	must.Eq(t, 1+0.75+0.25+0.5, m[0].Weighted)
	must.Eq(t, TierGPU|TierCPU, ix.Holds("a", 1))

	// Dropping the GPU copy leaves the CPU copy.
	must.NoError(t, ix.Remove("a", TierGPU, []uint64{1}, nil))
	must.Eq(t, TierCPU, ix.Holds("a", 1))
	m = ix.Match([]uint64{1, 2}, w, nil)
	must.Eq(t, 1.5, m[0].Weighted)
	must.Eq(t, 0, m[0].GPUBlocks)
	// Removing all tiers drops the entry.
	must.NoError(t, ix.Remove("a", 0, []uint64{1}, nil))
	must.Eq(t, 0, ix.Holds("a", 1))
	must.SliceLen(t, 0, ix.Match([]uint64{1, 2}, w, nil))
}

func TestCapacityEvictsLeastRecentlyStored(t *testing.T) {
	ix := New(Config{})
	must.NoError(t, ix.AddWorker("a", 3))
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 2, 3}, 0))
	// Refresh 1: now 2 is the least recent.
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1}, 1))
	must.NoError(t, ix.Store("a", TierGPU, []uint64{4}, 2))
	must.Eq(t, 3, ix.WorkerEntries("a"))
	must.Eq(t, 0, ix.Holds("a", 2))
	for _, d := range []uint64{1, 3, 4} {
		must.Eq(t, TierGPU, ix.Holds("a", d))
	}
	// Shrinking capacity evicts down to it, oldest first.
	must.NoError(t, ix.AddWorker("a", 1))
	must.Eq(t, 1, ix.WorkerEntries("a"))
	must.Eq(t, TierGPU, ix.Holds("a", 4))
}

func TestClearAndRemoveWorker(t *testing.T) {
	ix := newIndex(t, Config{}, "a", "b")
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 2, 3}, 0))
	must.NoError(t, ix.Store("b", TierGPU, []uint64{1, 2}, 0))
	n, err := ix.ClearWorker("a")
	must.NoError(t, err)
	must.Eq(t, 3, n)
	got := matchesByWorker(ix.Match([]uint64{1, 2, 3}, DefaultTierWeights(), nil))
	must.MapLen(t, 1, got)
	must.Eq(t, 2, got["b"].Blocks)
	// Still registered: it can store again.
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1}, 0))

	must.Eq(t, 2, ix.RemoveWorker("b"))
	must.ErrorIs(t, ix.Store("b", TierGPU, []uint64{1}, 0), ErrUnknownWorker)
	_, err = ix.ClearWorker("b")
	must.ErrorIs(t, err, ErrUnknownWorker)
	// A new worker reuses b's slot and sees none of b's entries.
	must.NoError(t, ix.AddWorker("c", 0))
	got = matchesByWorker(ix.Match([]uint64{1, 2}, DefaultTierWeights(), nil))
	must.MapLen(t, 1, got)
	must.Eq(t, 1, got["a"].Blocks)
	st := ix.Stats()
	must.Eq(t, 1, st.Entries)
	must.Eq(t, 1, st.Digests)
	must.Eq(t, 2, st.Workers)
}

func TestTTLExpires(t *testing.T) {
	const ms = int64(1e6)
	ix := newIndex(t, Config{TTL: 100 * ms}, "a", "b")
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 2}, 0))
	must.NoError(t, ix.Store("b", TierGPU, []uint64{1}, 50*ms))
	must.Eq(t, 2, ix.Expire(120*ms))
	must.Eq(t, 0, ix.WorkerEntries("a"))
	got := matchesByWorker(ix.Match([]uint64{1, 2}, DefaultTierWeights(), nil))
	must.MapLen(t, 1, got)
	must.Eq(t, 1, got["b"].Blocks)
	// A store refreshes the stamp.
	must.NoError(t, ix.Store("b", TierGPU, []uint64{1}, 140*ms))
	must.Eq(t, 0, ix.Expire(200*ms))
	must.Eq(t, 1, ix.WorkerEntries("b"))
	// A store sweeps the worker's expired entries.
	must.NoError(t, ix.Store("b", TierGPU, []uint64{5}, 400*ms))
	must.Eq(t, 1, ix.WorkerEntries("b"))
	must.Eq(t, 0, ix.Holds("b", 1))
	// A sweep with a clock read before a concurrent store's (its now is
	// older than the entry) keeps the entry.
	must.NoError(t, ix.Store("a", TierGPU, []uint64{7}, 500*ms))
	must.Eq(t, 0, ix.Expire(490*ms))
	must.Eq(t, 1, ix.WorkerEntries("a"))
}

func TestInvalidTier(t *testing.T) {
	ix := newIndex(t, Config{}, "a")
	must.Error(t, ix.Store("a", 0, []uint64{1}, 0))
	must.Error(t, ix.Store("a", Tier(0x80), []uint64{1}, 0))
}

// TestAgainstModel drives the index with random operations and compares every
// answer with a plain map model, covering table growth, backward-shift
// deletion and holder chains.
func TestAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ix := New(Config{})
	workers := []string{"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"}
	weights := TierWeights{GPU: 1, CPU: 0.5, Disk: 0.25, Peer: 0.125}
	wt := weights.table()
	model := map[string]map[uint64]Tier{}
	for _, w := range workers {
		must.NoError(t, ix.AddWorker(w, 0))
		model[w] = map[uint64]Tier{}
	}
	const keys = 3000
	for step := 0; step < 60000; step++ {
		w := workers[rng.IntN(len(workers))]
		d := uint64(rng.IntN(keys))
		if rng.IntN(2) == 0 {
			d = uint64(rng.IntN(12)) // hot keys: many holders, wide records
		}
		tier := Tier(1 << rng.IntN(numTiers))
		switch r := rng.IntN(100); {
		case r < 55:
			must.NoError(t, ix.Store(w, tier, []uint64{d}, 0))
			model[w][d] |= tier
		case r < 95:
			must.NoError(t, ix.Remove(w, tier, []uint64{d}, nil))
			if model[w][d] &^= tier; model[w][d] == 0 {
				delete(model[w], d)
			}
		case r < 96:
			_, err := ix.ClearWorker(w)
			must.NoError(t, err)
			model[w] = map[uint64]Tier{}
		case r < 98:
			req := make([]uint64, 1+rng.IntN(6))
			for i := range req {
				req[i] = uint64(rng.IntN(12))
				if rng.IntN(4) == 0 {
					req[i] = uint64(rng.IntN(keys)) // single holders, overflowed buckets
				}
			}
			got := matchesByWorker(ix.Match(req, weights, nil))
			for _, w := range workers {
				blocks, weighted, gpu := 0, 0.0, 0
				for _, k := range req {
					tiers := model[w][k]
					if tiers == 0 {
						break
					}
					blocks++
					weighted += float64(wt[tiers])
					if tiers&TierGPU != 0 {
						gpu++
					}
				}
				m := got[w]
				must.Eq(t, blocks, m.Blocks, must.Sprintf("step %d worker %s req %v", step, w, req))
				must.Eq(t, gpu, m.GPUBlocks, must.Sprintf("step %d worker %s", step, w))
				must.True(t, math.Abs(weighted-m.Weighted) < 1e-5, must.Sprintf("step %d worker %s weighted %v vs %v", step, w, weighted, m.Weighted))
			}
		default:
			for i := 0; i < 5; i++ {
				k := uint64(rng.IntN(keys))
				for _, w := range workers {
					must.Eq(t, model[w][k], ix.Holds(w, k), must.Sprintf("step %d worker %s key %d", step, w, k))
				}
			}
		}
	}
	entries, digests := 0, map[uint64]bool{}
	for _, w := range workers {
		entries += len(model[w])
		for k, tier := range model[w] {
			must.Eq(t, tier, ix.Holds(w, k))
			digests[k] = true
		}
		must.Eq(t, len(model[w]), ix.WorkerEntries(w))
	}
	st := ix.Stats()
	must.Eq(t, entries, st.Entries)
	must.Eq(t, len(digests), st.Digests)
}

// TestConcurrentMatchWhileApplying runs matches while a writer stores and
// removes: every match must be a valid prefix of what some state held (the
// full chain or nothing beyond it), never a torn answer. Run with -race.
func TestConcurrentMatchWhileApplying(t *testing.T) {
	ix := newIndex(t, Config{}, "a", "b")
	chain := make([]uint64, 64)
	for i := range chain {
		chain[i] = uint64(1000 + i)
	}
	must.NoError(t, ix.Store("b", TierGPU, chain[:8], 0))
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; i < 300; i++ {
			_ = ix.Store("a", TierGPU, chain, int64(i))
			_ = ix.Remove("a", 0, chain[32:], nil)
			_, _ = ix.ClearWorker("a")
		}
		close(stop)
	}()
	var bad []string
	var mu sync.Mutex
	for r := 0; r < 2; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var out []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				out = ix.Match(chain, DefaultTierWeights(), out[:0])
				for _, m := range out {
					ok := (m.Worker == "a" && (m.Blocks == 64 || m.Blocks == 32)) || (m.Worker == "b" && m.Blocks == 8)
					if !ok {
						mu.Lock()
						bad = append(bad, fmt.Sprintf("%+v", m))
						mu.Unlock()
					}
				}
			}
		}()
	}
	wg.Wait()
	must.SliceEmpty(t, bad)
}

func TestMatchManyWorkersSorted(t *testing.T) {
	ix := New(Config{})
	for i := 0; i < 300; i++ {
		must.NoError(t, ix.AddWorker(fmt.Sprintf("w%03d", i), 0))
		must.NoError(t, ix.Store(fmt.Sprintf("w%03d", i), TierGPU, []uint64{1, 2, 3}[:1+i%3], 0))
	}
	ms := ix.Match([]uint64{1, 2, 3}, DefaultTierWeights(), nil)
	must.SliceLen(t, 300, ms)
	sort.Slice(ms, func(i, j int) bool { return ms[i].Worker < ms[j].Worker })
	for i, m := range ms {
		must.Eq(t, 1+i%3, m.Blocks)
	}
	must.True(t, slices.IsSortedFunc(ms, func(a, b Match) int { return cmpStr(a.Worker, b.Worker) }))
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Match walks a lone worker's adjacent slab nodes; a neighbouring node only
// counts when it is that worker's live entry for the next digest.
func TestMatchAdjacentNodes(t *testing.T) {
	ix := newIndex(t, Config{}, "b", "a") // b has worker slot 0
	chain := make([]uint64, 3*matchBatch)
	for i := range chain {
		chain[i] = uint64(100 + i)
	}
	cut := 2 * matchBatch                                   // past the first probe batch: Match walks nodes there
	must.NoError(t, ix.Store("b", TierGPU, chain[:cut], 0)) // nodes 1..cut
	must.NoError(t, ix.Store("a", TierGPU, chain[cut:], 0)) // the next nodes: a lacks the prefix
	got := matchesByWorker(ix.Match(chain, DefaultTierWeights(), nil))
	must.MapLen(t, 1, got)
	must.Eq(t, cut, got["b"].Blocks)

	// A freed node is zeroed: worker slot 0 and digest 0 must not pass for
	// b's entry of digest 0.
	ix = newIndex(t, Config{}, "b")
	chain[cut] = 0
	must.NoError(t, ix.Store("b", TierGPU, chain[:cut+1], 0))
	must.NoError(t, ix.Remove("b", 0, []uint64{0}, nil))
	got = matchesByWorker(ix.Match(chain[:cut+1], DefaultTierWeights(), nil))
	must.Eq(t, cut, got["b"].Blocks)
}

// TestMatchChainsAgainstHolds stores and removes whole chains and pieces of
// them (so Match's walk along adjacent slab nodes meets runs stored in either
// direction, holes, capacity evictions, nodes reused from the free list and
// shared prefixes) and checks every Match against the longest prefix built
// from Holds, an independent lookup path.
func TestMatchChainsAgainstHolds(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	ix := New(Config{})
	workers := []string{"w0", "w1", "w2", "w3", "w4"}
	for i, w := range workers {
		must.NoError(t, ix.AddWorker(w, 150+100*i))
	}
	// 12 chains of 64 keys; chains 2k and 2k+1 share their first 16 keys.
	chains := make([][]uint64, 12)
	for c := range chains {
		chains[c] = make([]uint64, 64)
		for i := range chains[c] {
			chains[c][i] = uint64(c+1)<<32 | uint64(i)
			if i < 16 {
				chains[c][i] = uint64(c/2+1)<<48 | uint64(i)
			}
		}
	}
	weights := DefaultTierWeights()
	wt := weights.table()
	for step := 0; step < 20000; step++ {
		w := workers[rng.IntN(len(workers))]
		ch := chains[rng.IntN(len(chains))]
		lo := rng.IntN(len(ch))
		hi := lo + 1 + rng.IntN(len(ch)-lo)
		if rng.IntN(3) == 0 {
			lo = 0
		}
		switch r := rng.IntN(10); {
		case r < 5:
			must.NoError(t, ix.Store(w, Tier(1<<rng.IntN(numTiers)), ch[lo:hi], int64(step)))
		case r < 7:
			rev := slices.Clone(ch[lo:hi])
			slices.Reverse(rev) // frees nodes in the other order
			must.NoError(t, ix.Remove(w, 0, rev, nil))
		case r < 8:
			must.NoError(t, ix.Remove(w, Tier(1<<rng.IntN(numTiers)), ch[lo:lo+1], nil))
		case r < 9 && step%50 == 0:
			_, err := ix.ClearWorker(w)
			must.NoError(t, err)
		default:
			req := ch[:hi]
			got := matchesByWorker(ix.Match(req, weights, nil))
			for _, w := range workers {
				blocks, weighted, gpu := 0, 0.0, 0
				for _, k := range req {
					tiers := ix.Holds(w, k)
					if tiers == 0 {
						break
					}
					blocks++
					weighted += float64(wt[tiers])
					if tiers&TierGPU != 0 {
						gpu++
					}
				}
				m := got[w]
				must.Eq(t, blocks, m.Blocks, must.Sprintf("step %d worker %s", step, w))
				must.Eq(t, gpu, m.GPUBlocks, must.Sprintf("step %d worker %s", step, w))
				must.True(t, math.Abs(weighted-m.Weighted) < 1e-4, must.Sprintf("step %d worker %s weighted %v vs %v", step, w, weighted, m.Weighted))
			}
		}
	}
}
