// Command llmd-compare runs one prefix-index workload through llm-d's
// in-memory KV-block index (github.com/llm-d/llm-d-kv-cache-manager v0.3.2,
// kvblock.InMemoryIndex plus its longest-prefix scoring) and through Oasis's
// router/prefixindex in the same process, and prints both and their ratio:
// routing-decision latency (p50/p99), event ingest rate, and heap bytes per
// (block, worker) entry.
//
// It is a separate module so llm-d's dependency tree never enters Oasis's
// go.mod. Run from this directory: go run . (flags: -workers, -prompts,
// -blocks, -lookups).
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"time"

	"github.com/llm-d/llm-d-kv-cache-manager/pkg/kvcache/kvblock"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"k8s.io/apimachinery/pkg/util/sets"
)

type workload struct {
	workers, blocks, shared int
	prompts                 [][]uint64
	ids                     []string
}

// newWorkload builds prompts of `blocks` chained keys; the first `shared`
// keys are common to all prompts (a system prompt), the rest unique. Prompt
// p is held by worker p % workers; every holder also holds the shared prefix.
func newWorkload(workers, prompts, blocks, shared int) *workload {
	w := &workload{workers: workers, blocks: blocks, shared: shared}
	for i := 0; i < workers; i++ {
		w.ids = append(w.ids, fmt.Sprintf("worker-%02d", i))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for p := 0; p < prompts; p++ {
		keys := make([]uint64, blocks)
		for i := range keys {
			if i < shared {
				keys[i] = uint64(i + 1)
			} else {
				keys[i] = rng.Uint64()
			}
		}
		w.prompts = append(w.prompts, keys)
	}
	return w
}

// index is what both implementations do for the router.
type index interface {
	name() string
	store(worker string, keys []uint64)
	decide(keys []uint64) (best string, blocks int)
}

type oasisIndex struct {
	ix  *prefixindex.Index
	out []prefixindex.Match
}

func newOasis(w *workload) *oasisIndex {
	ix := prefixindex.New(prefixindex.Config{})
	for _, id := range w.ids {
		_ = ix.AddWorker(id, 0)
	}
	return &oasisIndex{ix: ix}
}

func (o *oasisIndex) name() string { return "oasis prefixindex" }
func (o *oasisIndex) store(worker string, keys []uint64) {
	_ = o.ix.Store(worker, prefixindex.TierGPU, keys, 0)
}
func (o *oasisIndex) decide(keys []uint64) (string, int) {
	o.out = o.ix.Match(keys, prefixindex.DefaultTierWeights(), o.out[:0])
	best, n := "", 0
	for _, m := range o.out {
		if m.Blocks > n {
			best, n = m.Worker, m.Blocks
		}
	}
	return best, n
}

type llmdIndex struct {
	ix   *kvblock.InMemoryIndex
	keys []kvblock.Key
}

func newLLMD(w *workload) *llmdIndex {
	ix, err := kvblock.NewInMemoryIndex(&kvblock.InMemoryIndexConfig{Size: 4 << 20, PodCacheSize: w.workers})
	if err != nil {
		panic(err)
	}
	return &llmdIndex{ix: ix}
}

func (l *llmdIndex) name() string { return "llm-d kvblock.InMemoryIndex" }
func (l *llmdIndex) toKeys(keys []uint64) []kvblock.Key {
	l.keys = l.keys[:0]
	for _, k := range keys {
		l.keys = append(l.keys, kvblock.Key{ModelName: "m", ChunkHash: k})
	}
	return l.keys
}
func (l *llmdIndex) store(worker string, keys []uint64) {
	_ = l.ix.Add(context.Background(), l.toKeys(keys), []kvblock.PodEntry{{PodIdentifier: worker, DeviceTier: "gpu"}})
}

// decide is llm-d's decision: Lookup, then its LongestPrefixScorer rule
// (score = length of the run of consecutive keys held from key 0, per pod),
// restated here because its package also links the cgo tokenizer.
func (l *llmdIndex) decide(keys []uint64) (string, int) {
	ks := l.toKeys(keys)
	podsPerKey, err := l.ix.Lookup(context.Background(), ks, sets.Set[string]{})
	if err != nil || len(ks) == 0 {
		return "", 0
	}
	scores := map[string]int{}
	active := sets.New(podsPerKey[ks[0]]...)
	for p := range active {
		scores[p] = 1
	}
	for i := 1; i < len(ks) && active.Len() > 0; i++ {
		active = active.Intersection(sets.New(podsPerKey[ks[i]]...))
		for p := range active {
			scores[p]++
		}
	}
	best, n := "", 0
	for p, s := range scores {
		if s > n {
			best, n = p, s
		}
	}
	return best, n
}

type result struct {
	name                 string
	buildS               float64
	bytesPerEntry        float64
	p50, p99             time.Duration
	ingestBlocksPerSec   float64
	entries              int
	checkedBest, correct int
}

func heap() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

func measure(w *workload, mk func() index, lookups int, profile string) result {
	before := heap()
	t0 := time.Now()
	ix := mk()
	entries := 0
	for p, keys := range w.prompts {
		ix.store(w.ids[p%w.workers], keys)
		entries += len(keys)
	}
	build := time.Since(t0)
	after := heap()
	// Each worker holds the shared keys once: count (block, worker) pairs.
	holders := min(len(w.prompts), w.workers)
	entries -= (len(w.prompts) - holders) * w.shared
	r := result{name: ix.name(), buildS: build.Seconds(), entries: entries,
		bytesPerEntry: float64(int64(after)-int64(before)) / float64(entries)}

	rng := rand.New(rand.NewPCG(7, 7))
	lat := make([]time.Duration, 0, lookups)
	stop := startProfile(profile)
	for i := 0; i < lookups; i++ {
		p := rng.IntN(len(w.prompts))
		t := time.Now()
		best, n := ix.decide(w.prompts[p])
		lat = append(lat, time.Since(t))
		r.checkedBest++
		if best == w.ids[p%w.workers] && n == w.blocks {
			r.correct++
		}
	}
	stop()
	slices.Sort(lat)
	r.p50, r.p99 = lat[len(lat)/2], lat[len(lat)*99/100]

	// Ingest: event-sized batches of 16 new blocks into the warm index.
	const batches = 40000
	batch := make([]uint64, 16)
	t0 = time.Now()
	for i := 0; i < batches; i++ {
		for j := range batch {
			batch[j] = rng.Uint64()
		}
		ix.store(w.ids[i%w.workers], batch)
	}
	r.ingestBlocksPerSec = float64(batches*len(batch)) / time.Since(t0).Seconds()
	runtime.KeepAlive(ix)
	return r
}

func main() {
	workers := flag.Int("workers", 64, "workers")
	prompts := flag.Int("prompts", 4700, "indexed prompts (4700 × 224 unique blocks ≈ 1.05M blocks)")
	blocks := flag.Int("blocks", 256, "blocks per prompt")
	shared := flag.Int("shared", 32, "leading blocks shared by every prompt")
	lookups := flag.Int("lookups", 20000, "routing decisions measured")
	sweepW := flag.String("sweep-workers", "", "decision-scaling sweep: comma-separated worker counts (with -sweep-blocks; replaces the single comparison)")
	sweepB := flag.String("sweep-blocks", "1000000,4000000,10000000", "decision-scaling sweep: distinct indexed blocks")
	llmdMax := flag.Int("llmd-max-entries", 1200000, "sweep: run llm-d's index only up to this many (block, worker) entries (~1 KB each)")
	llmdWorkers := flag.Int("llmd-max-workers", 256, "sweep: run llm-d's index only up to this many workers")
	profDir := flag.String("profile-dir", "", "sweep: write a CPU profile of each Oasis lookup loop here")
	flag.Parse()
	runtime.GOMAXPROCS(1) // one core, as the targets state
	if *sweepW != "" {
		if err := sweep(*sweepW, *sweepB, *blocks, *shared, *lookups, *llmdMax, *llmdWorkers, *profDir); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}

	w := newWorkload(*workers, *prompts, *blocks, *shared)
	fmt.Printf("workload: %d workers, %d prompts × %d blocks (%d shared), %d lookups, GOMAXPROCS=1\n",
		*workers, *prompts, *blocks, *shared, *lookups)
	oa := measure(w, func() index { return newOasis(w) }, *lookups, "")
	ll := measure(w, func() index { return newLLMD(w) }, *lookups, "")
	for _, r := range []result{oa, ll} {
		fmt.Printf("%-28s entries %8d  bytes/entry %6.1f  decision p50 %8v p99 %8v  ingest %10.0f blocks/s  correct %d/%d  build %.2fs\n",
			r.name, r.entries, r.bytesPerEntry, r.p50, r.p99, r.ingestBlocksPerSec, r.correct, r.checkedBest, r.buildS)
	}
	fmt.Printf("ratio llm-d/oasis: decision p50 %.1fx, p99 %.1fx; ingest oasis/llm-d %.1fx; bytes/entry llm-d/oasis %.1fx\n",
		float64(ll.p50)/float64(oa.p50), float64(ll.p99)/float64(oa.p99),
		oa.ingestBlocksPerSec/ll.ingestBlocksPerSec, ll.bytesPerEntry/oa.bytesPerEntry)
	if oa.correct != oa.checkedBest {
		fmt.Fprintln(os.Stderr, "oasis index chose a wrong worker")
		os.Exit(1)
	}
}
