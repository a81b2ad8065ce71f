package engine

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/shoenig/test/must"
)

func seqTokens(start, n int) []int32 {
	t := make([]int32, n)
	for i := range t {
		t[i] = int32(start + i)
	}
	return t
}

func out(n int) []int32 { return seqTokens(900000, n) }

func newEngine(t *testing.T, cfg Config) *Engine {
	t.Helper()
	e, err := New(cfg)
	must.NoError(t, err)
	return e
}

// runAll steps until idle and returns every output by request id, plus all events.
func runAll(t *testing.T, e *Engine) (map[string][]Output, []kvevents.Event, []time.Duration) {
	t.Helper()
	outs := map[string][]Output{}
	var events []kvevents.Event
	var durs []time.Duration
	for i := 0; e.HasWork(); i++ {
		must.Less(t, 100000, i, must.Sprint("engine does not make progress"))
		r := e.Step()
		for _, o := range r.Outputs {
			outs[o.ID] = append(outs[o.ID], o)
		}
		events = append(events, r.Events...)
		durs = append(durs, r.Duration)
	}
	return outs, events, durs
}

func assertNoLeak(t *testing.T, e *Engine) {
	t.Helper()
	st := e.Stats()
	must.Eq(t, 0, st.UsedBlocks, must.Sprint("blocks still referenced"))
	must.Eq(t, 0, st.Running+st.Waiting)
	for i, b := range e.pool.blocks {
		must.Eq(t, int32(0), b.ref, must.Sprintf("block %d", i))
	}
	must.Eq(t, e.pool.total, e.pool.numFree)
	// The free list is consistent: walk it.
	n := e.pool.total - len(e.pool.blocks)
	for i := e.pool.queue.head; i != noBlock; i = e.pool.queue.links[i].next {
		n++
	}
	must.Eq(t, e.pool.numFree, n)
}

func TestPrefixHitAfterIdenticalPrefix(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 16, NumGPUBlocks: 64})
	prompt := seqTokens(1, 65) // 4 full blocks + 1
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: prompt, Output: out(2)}))
	outs, _, _ := runAll(t, e)
	must.Eq(t, 0, outs["a"][0].CachedTokens)

	must.NoError(t, e.Submit(&Request{ID: "b", Prompt: prompt, Output: out(2)}))
	outs, _, _ = runAll(t, e)
	must.Eq(t, 64, outs["b"][0].CachedTokens)

	// A 64-token prompt can hit only 3 blocks: the last token is always computed.
	must.NoError(t, e.Submit(&Request{ID: "c", Prompt: prompt[:64], Output: out(1)}))
	outs, _, _ = runAll(t, e)
	must.Eq(t, 48, outs["c"][0].CachedTokens)

	// A prompt sharing the first 40 tokens hits 2 full blocks (32 tokens).
	p2 := append(append([]int32{}, prompt[:40]...), seqTokens(5000, 30)...)
	must.NoError(t, e.Submit(&Request{ID: "d", Prompt: p2, Output: out(1)}))
	outs, _, _ = runAll(t, e)
	must.Eq(t, 32, outs["d"][0].CachedTokens)

	st := e.Stats()
	must.Eq(t, uint64(65+65+64+70), st.PrefixQueries)
	must.Eq(t, uint64(64+48+32), st.PrefixHits)
	assertNoLeak(t, e)
}

func TestSameBlockAtAnotherPositionMisses(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 64})
	x, y := seqTokens(10, 4), seqTokens(20, 4)
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: concat(x, y, seqTokens(30, 1)), Output: out(1)}))
	runAll(t, e)
	// y is cached as the second block after x; as a first block it must miss.
	must.NoError(t, e.Submit(&Request{ID: "b", Prompt: concat(y, x, seqTokens(30, 1)), Output: out(1)}))
	outs, _, _ := runAll(t, e)
	must.Eq(t, 0, outs["b"][0].CachedTokens)
	// And after a different first block, x at position 1 misses too.
	must.NoError(t, e.Submit(&Request{ID: "c", Prompt: concat(seqTokens(40, 4), y, seqTokens(30, 1)), Output: out(1)}))
	outs, _, _ = runAll(t, e)
	must.Eq(t, 0, outs["c"][0].CachedTokens)
	must.NotEq(t, BlockHash(0, false, y), BlockHash(BlockHash(0, false, x), true, y))
	assertNoLeak(t, e)
}

func concat(parts ...[]int32) []int32 {
	var out []int32
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// vLLM's eviction order: free blocks queue up in the order they were freed, each
// request's blocks tail first, and allocation takes from the head.
func TestEvictionOrder(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 6, KVEvents: true})
	a := seqTokens(100, 8) // blocks a0 a1
	b := seqTokens(200, 8) // blocks b0 b1
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: a, Output: out(1)}))
	_, evA, _ := runAll(t, e)
	must.NoError(t, e.Submit(&Request{ID: "b", Prompt: b, Output: out(1)}))
	_, evB, _ := runAll(t, e)
	ha0 := BlockHash(0, false, a[:4])
	ha1 := BlockHash(ha0, true, a[4:])
	hb0 := BlockHash(0, false, b[:4])
	hb1 := BlockHash(hb0, true, b[4:])
	must.Eq(t, []kvevents.Event{stored(nil, []uint64{ha0, ha1}, a, 4)}, evA)
	must.Eq(t, []kvevents.Event{stored(nil, []uint64{hb0, hb1}, b, 4)}, evB)
	must.Eq(t, 4, e.Stats().CachedBlocks)

	// Free queue now: 2 never-used blocks, then a1, a0, then b1, b0. A new 12-token
	// prompt needs 3 blocks: the two unused ones, then a1 (a's tail, freed first).
	must.NoError(t, e.Submit(&Request{ID: "c", Prompt: seqTokens(300, 12), Output: out(1)}))
	_, evC, _ := runAll(t, e)
	must.Eq(t, kvevents.Event(kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashUint64(ha1)}, Medium: "GPU"}), evC[0])
	cachedNow := func(h uint64) bool { _, ok := e.pool.lookup(h); return ok }
	must.True(t, cachedNow(ha0))
	must.False(t, cachedNow(ha1))
	must.True(t, cachedNow(hb0) && cachedNow(hb1))

	// Free queue: a0, b1, b0, then c's blocks. One new block evicts a0 ...
	must.NoError(t, e.Submit(&Request{ID: "d", Prompt: seqTokens(400, 3), Output: out(1)}))
	_, evD, _ := runAll(t, e)
	must.Eq(t, []kvevents.Event{kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashUint64(ha0)}, Medium: "GPU"}}, evD)
	// ... and two more evict b's tail block before its head block.
	must.NoError(t, e.Submit(&Request{ID: "e", Prompt: seqTokens(500, 7), Output: out(1)}))
	_, evE, _ := runAll(t, e)
	must.Eq(t, kvevents.Event(kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashUint64(hb1), kvevents.HashUint64(hb0)}, Medium: "GPU"}), evE[0])
	assertNoLeak(t, e)
}

func stored(parent *uint64, hashes []uint64, tokens []int32, bs int) kvevents.BlockStored {
	ev := kvevents.BlockStored{TokenIDs: tokens, BlockSize: bs, Medium: "GPU"}
	if parent != nil {
		p := kvevents.HashUint64(*parent)
		ev.ParentBlockHash = &p
	}
	for _, h := range hashes {
		ev.BlockHashes = append(ev.BlockHashes, kvevents.HashUint64(h))
	}
	return ev
}

// Blocks a running request holds are never evicted; a hit revives a free cached block.
func TestHeldBlocksAreNotEvicted(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 4})
	p := seqTokens(1, 8)
	must.NoError(t, e.Submit(&Request{ID: "long", Prompt: p, Output: out(4)})) // 12 tokens: 3 blocks
	e.Step()                                                                   // prefill
	// A second request needs 2 blocks, only 1 is free: it waits, nothing is evicted.
	must.NoError(t, e.Submit(&Request{ID: "other", Prompt: seqTokens(50, 5), Output: out(1)}))
	r := e.Step()
	must.Eq(t, 1, len(r.Outputs))
	must.Eq(t, "long", r.Outputs[0].ID)
	must.Eq(t, 1, e.Stats().Waiting)
	runAll(t, e)
	assertNoLeak(t, e)
}

func TestChunkedPrefillAndTiming(t *testing.T) {
	tm := Timing{StepBase: time.Millisecond, PerPrefillToken: 10 * time.Microsecond, PerDecodeSeq: 100 * time.Microsecond}
	e := newEngine(t, Config{BlockSize: 16, NumGPUBlocks: 100, MaxNumBatchedTokens: 32, Timing: tm})
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 100), Output: out(3)}))
	var firstAt int
	var durs []time.Duration
	for i := 0; e.HasWork(); i++ {
		r := e.Step()
		durs = append(durs, r.Duration)
		if len(r.Outputs) > 0 && r.Outputs[0].Index == 0 {
			firstAt = i
		}
	}
	// 100 prompt tokens in chunks of 32: 32, 32, 32, 4 (first token), then 2 decodes.
	must.Eq(t, 3, firstAt)
	must.Eq(t, []time.Duration{
		tm.StepTime(32, 0), tm.StepTime(32, 0), tm.StepTime(32, 0), tm.StepTime(4, 0), tm.StepTime(0, 1), tm.StepTime(0, 1),
	}, durs)

	// A cached prompt's first step is cheaper: only the uncached tail is computed.
	e2 := newEngine(t, Config{BlockSize: 16, NumGPUBlocks: 100, Timing: tm})
	p := seqTokens(1, 200)
	must.NoError(t, e2.Submit(&Request{ID: "x", Prompt: p, Output: out(1)}))
	cold := e2.Step().Duration
	must.NoError(t, e2.Submit(&Request{ID: "y", Prompt: p, Output: out(1)}))
	warm := e2.Step().Duration
	must.Eq(t, tm.StepTime(200, 0), cold)
	must.Eq(t, tm.StepTime(200-192, 0), warm)
	must.Less(t, cold, warm)
}

func TestContinuousBatchingLimits(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 16, NumGPUBlocks: 1000, MaxNumSeqs: 3})
	for i := range 5 {
		must.NoError(t, e.Submit(&Request{ID: fmt.Sprint(i), Prompt: seqTokens(i*1000, 20), Output: out(5)}))
	}
	r := e.Step()
	must.Len(t, 3, r.Outputs)
	first := append([]Output(nil), r.Outputs...)
	st := e.Stats()
	must.Eq(t, 3, st.Running)
	must.Eq(t, 2, st.Waiting)
	// Decoding requests and a new prefill share the next steps once a slot frees.
	outs, _, _ := runAll(t, e)
	for _, o := range first {
		outs[o.ID] = append([]Output{o}, outs[o.ID]...)
	}
	for i := range 5 {
		must.Len(t, 5, outs[fmt.Sprint(i)])
		must.True(t, outs[fmt.Sprint(i)][4].Finished)
	}
	assertNoLeak(t, e)
}

func TestPreemptionRecomputesAndFinishes(t *testing.T) {
	// Two requests that each grow to 5 blocks in a 8-block cache: the later one is
	// preempted when the earlier needs a block, then recomputed.
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 8})
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 8), Output: out(12)}))
	must.NoError(t, e.Submit(&Request{ID: "b", Prompt: seqTokens(100, 8), Output: out(12)}))
	outs, _, _ := runAll(t, e)
	must.Len(t, 12, outs["a"])
	must.Len(t, 12, outs["b"])
	for i, o := range outs["b"] {
		must.Eq(t, i, o.Index)
		must.Eq(t, out(12)[i], o.Token)
	}
	must.Positive(t, e.Stats().Preemptions)
	assertNoLeak(t, e)
}

// A request preempted before its first token hits its own cached blocks when it
// is rescheduled; like vLLM's num_cached_tokens, its reported cached tokens stay
// those of its first scheduling.
func TestPreemptedBeforeFirstTokenKeepsFirstCachedCount(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 8, MaxNumBatchedTokens: 4})
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 4), Output: out(24)}))
	must.NoError(t, e.Submit(&Request{ID: "b", Prompt: seqTokens(100, 24), Output: out(1)}))
	outs, _, _ := runAll(t, e)
	must.Positive(t, e.Stats().Preemptions)
	must.Len(t, 1, outs["b"])
	must.Eq(t, 0, outs["b"][0].CachedTokens)
	assertNoLeak(t, e)
}

func TestAbortFreesBlocks(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 32})
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 30), Output: out(50)}))
	must.NoError(t, e.Submit(&Request{ID: "w", Prompt: seqTokens(500, 30), Output: out(50)}))
	e.Step()
	e.Step()
	must.Positive(t, e.Stats().UsedBlocks)
	must.True(t, e.Abort("a"))
	must.True(t, e.Abort("w"))
	must.False(t, e.Abort("a"))
	assertNoLeak(t, e)
	must.False(t, e.HasWork())
}

func TestSubmitErrors(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 4})
	must.ErrorIs(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 17), Output: out(1)}), ErrTooLong)
	must.ErrorIs(t, e.Submit(&Request{ID: "a", Output: out(1)}), ErrEmpty)
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 3), Output: out(1)}))
	must.ErrorIs(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 3), Output: out(1)}), ErrDuplicateID)
	_, err := New(Config{BlockSize: -1})
	must.Error(t, err)
}

func TestKVEventsChainAcrossSteps(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 64, MaxNumBatchedTokens: 8, KVEvents: true})
	p := seqTokens(1, 16)
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: p, Output: out(5)}))
	_, events, _ := runAll(t, e)
	h := []uint64{BlockHash(0, false, p[:4])}
	for k := 1; k < 5; k++ {
		var toks []int32
		if k < 4 {
			toks = p[k*4 : k*4+4]
		} else {
			toks = out(5)[:4]
		}
		h = append(h, BlockHash(h[k-1], true, toks))
	}
	// Chunks of 8 tokens: blocks 0-1, then 2-3; the 5th block (4 output tokens) fills
	// when its last token's KV is computed.
	must.Eq(t, []kvevents.Event{
		stored(nil, h[0:2], p[:8], 4),
		stored(&h[1], h[2:4], p[8:], 4),
		stored(&h[3], h[4:5], out(5)[:4], 4),
	}, events)
}

func TestResetPrefixCache(t *testing.T) {
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 16, KVEvents: true})
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: seqTokens(1, 9), Output: out(1)}))
	runAll(t, e)
	must.Eq(t, 2, e.Stats().CachedBlocks)
	must.True(t, e.ResetPrefixCache())
	must.Eq(t, []kvevents.Event{kvevents.AllBlocksCleared{}}, e.DrainEvents())
	must.Eq(t, 0, e.Stats().CachedBlocks)
}

// Random load with aborts never leaks a block and the same input gives the same
// output (the engine is deterministic).
func TestRandomWorkloadNoLeakDeterministic(t *testing.T) {
	for _, cpu := range []int{0, 12} {
		t.Run(fmt.Sprint("cpu blocks ", cpu), func(t *testing.T) { randomWorkload(t, cpu) })
	}
}

func randomWorkload(t *testing.T, cpuBlocks int) {
	run := func() []string {
		e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 40, MaxNumSeqs: 6, MaxNumBatchedTokens: 24, CPUBlocks: cpuBlocks, KVEvents: true})
		rng := rand.New(rand.NewPCG(1, 2))
		var trace []string
		live := []string{}
		for i := range 400 {
			switch {
			case rng.IntN(3) == 0:
				id := fmt.Sprint("r", i)
				// Shared prefixes so hits happen.
				p := concat(seqTokens(rng.IntN(4)*1000, 4*rng.IntN(4)), seqTokens(10000+i*50, 1+rng.IntN(20)))
				if err := e.Submit(&Request{ID: id, Prompt: p, Output: out(1 + rng.IntN(15))}); err == nil {
					live = append(live, id)
				}
			case rng.IntN(8) == 0 && len(live) > 0:
				k := rng.IntN(len(live))
				e.Abort(live[k])
				trace = append(trace, "abort "+live[k])
				live = append(live[:k], live[k+1:]...)
			default:
				r := e.Step()
				for _, o := range r.Outputs {
					trace = append(trace, fmt.Sprint(o.ID, o.Index, o.CachedTokens, o.Finished))
				}
				trace = append(trace, fmt.Sprint(r.Duration))
			}
		}
		runAll(t, e)
		assertNoLeak(t, e)
		if e.cpu != nil {
			// The CPU LRU list and index agree and stay within capacity.
			n := 0
			for i := e.cpu.order.head; i != noBlock; i = e.cpu.order.links[i].next {
				must.True(t, e.cpu.has(e.cpu.hashes[i]))
				n++
			}
			must.Eq(t, e.cpu.len(), n)
			must.LessEq(t, cpuBlocks, n)
			must.Positive(t, e.Stats().CPUHits, must.Sprint("the workload exercises CPU hits"))
			trace = append(trace, fmt.Sprint("cpu hits ", e.Stats().CPUHits))
		}
		return trace
	}
	must.Eq(t, run(), run())
}

func TestBusyTrackerAndPower(t *testing.T) {
	var b BusyTracker
	must.Eq(t, 0.0, b.Utilization(time.Second))
	// Busy half of every 100ms bucket for a second.
	for k := range 10 {
		b.Add(time.Duration(k)*100*time.Millisecond, 50*time.Millisecond)
	}
	must.Eq(t, 0.5, b.Utilization(time.Second))
	// Two idle seconds later the window is empty.
	must.Eq(t, 0.0, b.Utilization(3*time.Second))
	p := PowerModel{IdleWatts: 70, WattsPerUtil: 630}
	must.Eq(t, 385.0, p.Watts(0.5))
	must.Eq(t, 700.0, p.Watts(2))
}

func TestBlocksForMemory(t *testing.T) {
	must.Eq(t, 27648, BlocksForMemory(0.9, 16))
	must.Eq(t, 0, BlocksForMemory(0.1, 16))
}

func BenchmarkStep(b *testing.B) {
	e, _ := New(Config{BlockSize: 16, NumGPUBlocks: 20000, MaxNumSeqs: 256})
	prefix := seqTokens(1, 96)
	i := 0
	for b.Loop() {
		for e.Stats().Running+e.Stats().Waiting < 256 {
			i++
			_ = e.Submit(&Request{ID: fmt.Sprint(i), Prompt: concat(prefix, seqTokens(i*100, 32)), Output: out(16)})
		}
		e.Step()
	}
}

func TestCPUTierOffloading(t *testing.T) {
	tm := Timing{StepBase: time.Millisecond, PerPrefillToken: 10 * time.Microsecond, PerLoadedToken: time.Microsecond}
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 4, CPUBlocks: 6, KVEvents: true, Timing: tm})
	a := seqTokens(100, 8)
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: a, Output: out(1)}))
	_, evA, _ := runAll(t, e)
	ha0 := BlockHash(0, false, a[:4])
	ha1 := BlockHash(ha0, true, a[4:])
	// Written through to the CPU tier as it is cached on the GPU.
	cpuStored := stored(nil, []uint64{ha0, ha1}, a, 4)
	cpuStored.Medium = kvevents.MediumCPU
	must.Eq(t, []kvevents.Event{stored(nil, []uint64{ha0, ha1}, a, 4), cpuStored}, evA)

	// A 15-token prompt needs all 4 GPU blocks: a's blocks leave the GPU, not the CPU.
	b := seqTokens(200, 15)
	must.NoError(t, e.Submit(&Request{ID: "b", Prompt: b, Output: out(1)}))
	_, evB, _ := runAll(t, e)
	must.Eq(t, kvevents.Event(kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{kvevents.HashUint64(ha1), kvevents.HashUint64(ha0)}, Medium: "GPU"}), evB[0])
	must.Eq(t, 5, e.Stats().CPUCachedBlocks)

	// Another 15-token prompt evicts b from the GPU and overflows the 6-block CPU tier:
	// a's blocks, least recently used, leave the CPU.
	c := seqTokens(300, 15)
	must.NoError(t, e.Submit(&Request{ID: "c", Prompt: c, Output: out(1)}))
	_, evC, _ := runAll(t, e)
	var cpuRemoved []kvevents.Hash
	for _, ev := range evC {
		if r, ok := ev.(kvevents.BlockRemoved); ok && r.Medium == kvevents.MediumCPU {
			cpuRemoved = append(cpuRemoved, r.BlockHashes...)
		}
	}
	must.Eq(t, []kvevents.Hash{kvevents.HashUint64(ha0), kvevents.HashUint64(ha1)}, cpuRemoved)
	must.Eq(t, 6, e.Stats().CPUCachedBlocks)
	hb0 := BlockHash(0, false, b[:4])
	_, onGPU := e.pool.lookup(hb0)
	must.False(t, onGPU)

	// b's prefix comes back from the CPU at load cost instead of prefill.
	must.NoError(t, e.Submit(&Request{ID: "b2", Prompt: concat(b[:8], seqTokens(900, 1)), Output: out(1)}))
	r := e.Step()
	must.Eq(t, 8, r.LoadedTokens)
	must.Eq(t, 8, r.Outputs[0].CachedTokens)
	must.Eq(t, tm.StepTime(1, 0)+8*tm.PerLoadedToken, r.Duration)
	st := e.Stats()
	must.Eq(t, uint64(8), st.CPUHits)
	must.Eq(t, uint64(0), st.PrefixHits)
	// Loaded blocks are cached on the GPU again (GPU BlockStored after the GPU
	// evictions that made room, no new CPU store).
	must.Len(t, 2, r.Events)
	must.Eq(t, "GPU", r.Events[0].(kvevents.BlockRemoved).Medium)
	must.Eq(t, kvevents.Event(stored(nil, []uint64{hb0, BlockHash(hb0, true, b[4:8])}, b[:8], 4)), r.Events[1])
	assertNoLeak(t, e)
}

// TestDiskTier: blocks are spilled to the disk tier when they enter CPU
// memory, a hit continues from CPU into disk at disk cost, and blocks read from
// disk are written back to CPU memory (a promotion) but not to disk again.
func TestDiskTier(t *testing.T) {
	tm := Timing{StepBase: time.Millisecond, PerPrefillToken: 10 * time.Microsecond, PerLoadedToken: time.Microsecond, PerDiskLoadedToken: 3 * time.Microsecond}
	e := newEngine(t, Config{BlockSize: 4, NumGPUBlocks: 4, CPUBlocks: 2, DiskBlocks: 16, KVEvents: true, Timing: tm})
	a := seqTokens(100, 8)
	must.NoError(t, e.Submit(&Request{ID: "a", Prompt: a, Output: out(1)}))
	_, evA, _ := runAll(t, e)
	ha0 := BlockHash(0, false, a[:4])
	ha1 := BlockHash(ha0, true, a[4:])
	cpuStored := stored(nil, []uint64{ha0, ha1}, a, 4)
	cpuStored.Medium = kvevents.MediumCPU
	diskStored := stored(nil, []uint64{ha0, ha1}, a, 4)
	diskStored.Medium = "DISK"
	must.Eq(t, []kvevents.Event{stored(nil, []uint64{ha0, ha1}, a, 4), cpuStored, diskStored}, evA)

	// Two 15-token prompts push a off the GPU and out of the 2-block CPU
	// tier; the disk keeps it (no DISK removal).
	for _, p := range [][]int32{seqTokens(200, 15), seqTokens(300, 15)} {
		must.NoError(t, e.Submit(&Request{ID: fmt.Sprint(p[0]), Prompt: p, Output: out(1)}))
		_, evs, _ := runAll(t, e)
		for _, ev := range evs {
			if r, ok := ev.(kvevents.BlockRemoved); ok {
				must.NotEq(t, "DISK", r.Medium)
			}
		}
	}
	must.Eq(t, 2, e.Stats().CPUCachedBlocks)
	must.Eq(t, 2+3+3, e.Stats().DiskCachedBlocks) // a: 2 full blocks, each 15-token prompt 3
	must.False(t, e.cpu.has(ha0))

	// a's prefix comes back from disk at disk cost.
	must.NoError(t, e.Submit(&Request{ID: "a2", Prompt: concat(a, seqTokens(900, 1)), Output: out(1)}))
	r := e.Step()
	must.Eq(t, 8, r.LoadedTokens)
	must.Eq(t, 8, r.DiskLoadedTokens)
	must.Eq(t, 8, r.Outputs[0].CachedTokens)
	must.Eq(t, tm.StepTime(1, 0)+8*tm.PerDiskLoadedToken, r.Duration)
	st := e.Stats()
	must.Eq(t, uint64(8), st.DiskHits)
	must.Eq(t, uint64(0), st.CPUHits)
	// Promoted: stored on the GPU and in CPU memory again, not on disk.
	media := map[string]int{}
	for _, ev := range r.Events {
		if s, ok := ev.(kvevents.BlockStored); ok {
			media[s.Medium] += len(s.BlockHashes)
		}
	}
	must.Eq(t, map[string]int{"GPU": 2, "CPU": 2}, media)
	must.True(t, e.cpu.has(ha0))
	assertNoLeak(t, e)
}

// A HoldKV request keeps its blocks after finishing until ReleaseHeld.
func TestHoldKV(t *testing.T) {
	e, err := New(Config{BlockSize: 4, NumGPUBlocks: 10})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9}
	if err := e.Submit(&Request{ID: "p", Prompt: prompt, Output: []int32{1}, HoldKV: true}); err != nil {
		t.Fatal(err)
	}
	for e.HasWork() {
		e.Step()
	}
	blocks, ok := e.HeldBlocks("p")
	if !ok || len(blocks) != 3 {
		t.Fatalf("held blocks %v, %v; want 3", blocks, ok)
	}
	if st := e.Stats(); st.HeldBlocks != 3 || st.UsedBlocks != 3 {
		t.Fatalf("stats %+v: want 3 held and used", st)
	}
	if !e.ReleaseHeld("p") || e.ReleaseHeld("p") {
		t.Fatal("ReleaseHeld: want true once")
	}
	if st := e.Stats(); st.HeldBlocks != 0 || st.UsedBlocks != 0 {
		t.Fatalf("stats %+v after release", st)
	}
	// An aborted HoldKV request holds nothing.
	if err := e.Submit(&Request{ID: "a", Prompt: prompt, Output: []int32{1, 2}, HoldKV: true}); err != nil {
		t.Fatal(err)
	}
	e.Step()
	e.Abort("a")
	if _, ok := e.HeldBlocks("a"); ok {
		t.Fatal("aborted request holds blocks")
	}
}
