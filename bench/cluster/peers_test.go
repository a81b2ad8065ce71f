package cluster

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/oasis-llm/oasis/router/scoring"
)

// testView is a decision over n workers with the given requests in flight.
func testView(inFlight []int, keys []uint64) *peerView {
	s := &sim{rng: rand.New(rand.NewPCG(1, 2))}
	for i, n := range inFlight {
		w := &worker{idx: int32(i), sw: &scoring.Worker{ID: fmt.Sprintf("w%03d", i), Live: scoring.NewLive()}}
		w.pl.inFlight = n
		s.workers = append(s.workers, w)
	}
	return &peerView{s: s, keys: keys, input: len(keys) * 16, uncached: len(keys) * 16}
}

func seq(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

// SGLang: a prompt mostly cached on a worker goes there while the loads are
// balanced, and to the least loaded worker once max − min > 64 and max > 1.5 ×
// min; a prompt matching under cache_threshold goes to the smallest tree.
func TestSGLangBalanceThreshold(t *testing.T) {
	keys := seq(1, 10)
	p := newSGLang(3)
	p.tree.store(0, keys, 0)
	p.tree.store(1, seq(100, 30), 0) // worker 1: the largest tree; worker 2 empty
	if w := p.pick(testView([]int{70, 10, 60}, keys)); w != 0 {
		t.Errorf("balanced (70-10 = 60 <= 64): picked %d, want the cache holder 0", w)
	}
	if w := p.pick(testView([]int{80, 10, 60}, keys)); w != 1 {
		t.Errorf("imbalanced (80-10 > 64, 80 > 1.5×10): picked %d, want least loaded 1", w)
	}
	if w := p.pick(testView([]int{200, 150, 190}, keys)); w != 0 {
		t.Errorf("abs diff 50: picked %d, want the cache holder 0", w)
	}
	// 2 of 10 blocks matched (0.2 <= 0.3): the smallest tree, worker 2.
	low := append(seq(1, 2), seq(500, 8)...)
	if w := p.pick(testView([]int{0, 0, 0}, low)); w != 2 {
		t.Errorf("match rate 0.2: picked %d, want smallest tree 2", w)
	}
}

// Dynamo: cost = overlap weight × prefill blocks + decode blocks, the lowest
// wins at temperature 0; softmax over min-max normalised costs otherwise.
func TestDynamoCost(t *testing.T) {
	// 160 tokens prefilling + 320 new = 30 blocks; 1600 active + 480 prompt = 130 blocks.
	if c := dynamoCost(160, 320, 1600, 480, 16, 1); c != 160 {
		t.Errorf("cost %v, want 160", c)
	}
	if c := dynamoCost(160, 320, 1600, 480, 16, 2); c != 190 {
		t.Errorf("cost with overlap weight 2: %v, want 190", c)
	}
	if w := softmaxSample([]float64{5, 3, 4}, 0, nil); w != 1 {
		t.Errorf("temperature 0 picked %d, want 1", w)
	}
	// Costs 0 and 10 normalise to 0 and 1: weights 1 and e^-1 at T = 1.
	p0 := 1 / (1 + math.Exp(-1))
	if w := softmaxSample([]float64{0, 10}, 1, func() float64 { return p0 - 0.01 }); w != 0 {
		t.Errorf("sample below p0 picked %d", w)
	}
	if w := softmaxSample([]float64{0, 10}, 1, func() float64 { return p0 + 0.01 }); w != 1 {
		t.Errorf("sample above p0 picked %d", w)
	}
	// Approximate mode: the worker the prompt went to has the overlap, and
	// loses it after the 120 s TTL.
	p := newDynamo(2, false, 0, 16)
	v := testView([]int{0, 0}, seq(1, 8))
	p.routed(v, 1)
	if w := p.pick(v); w != 1 || v.uncached != 0 {
		t.Errorf("cached on 1: picked %d with %d uncached", w, v.uncached)
	}
	v.now = 121e9
	if w := p.pick(v); w != 0 {
		t.Errorf("after the TTL: picked %d, want 0", w)
	}
}

// AIBrix: imbalance over 8 running requests routes to the least loaded;
// otherwise the best match whose load is within mean + 1 σ.
func TestAIBrixPrefixCache(t *testing.T) {
	keys := seq(1, 64) // 8 AIBrix blocks of 128 tokens
	p := newAIBrix(4)
	p.tree.store(0, keys, 0)
	p.tree.store(1, keys[:32], 0)
	if w := p.pick(testView([]int{4, 4, 4, 4}, keys)); w != 0 {
		t.Errorf("balanced: picked %d, want full match 0", w)
	}
	// Loads 8,2,1,1: mean 3, σ ≈ 2.92, limit 5.92: worker 0 over it, 1 next.
	if w := p.pick(testView([]int{8, 2, 1, 1}, keys)); w != 1 {
		t.Errorf("holder over mean+σ: picked %d, want partial match 1", w)
	}
	if w := p.pick(testView([]int{10, 5, 1, 3}, keys)); w != 2 {
		t.Errorf("imbalance 9 > 8: picked %d, want least loaded 2", w)
	}
}

// production-stack: uniformly among the endpoints with the longest match.
func TestProdStackLongestMatch(t *testing.T) {
	keys := seq(1, 8)
	p := newProdStack(4)
	p.tree.store(2, keys, 0)
	for range 20 {
		if w := p.pick(testView([]int{0, 0, 0, 0}, keys)); w != 2 {
			t.Fatalf("picked %d, want the only holder 2", w)
		}
	}
	seen := map[int]bool{}
	v := testView([]int{0, 0, 0, 0}, seq(100, 8))
	for range 200 {
		seen[p.pick(v)] = true
	}
	if len(seen) != 4 {
		t.Errorf("no match: picked %v, want all four", seen)
	}
}

// llm-d: precise prefix scores min-max normalised; the weighted sum with KV
// utilisation and queue picks the highest.
func TestLLMDScores(t *testing.T) {
	got := minMaxMatched([]int{0, 4, 8, 6})
	want := []float64{0, 0, 1, 0.5}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("normalised %v, want %v", got, want)
		}
	}
	if got := minMaxMatched([]int{3, 3}); got[0] != 1 || got[1] != 1 {
		t.Errorf("equal matches %v, want 1s", got)
	}
	// Approximate mode, 64-token blocks: worker 1 holds the prompt, but its
	// full KV cache and long queue (2×1 + 2×1 lost) outweigh 3 × 1 of prefix.
	p := newLLMD(2, false)
	v := testView([]int{0, 0}, seq(1, 16))
	p.routed(v, 1)
	if w := p.pick(v); w != 1 {
		t.Errorf("idle workers: picked %d, want the holder 1", w)
	}
	v.s.workers[1].sw.Live.SetEngine(10, 20, 1, v.s.workers[1].sw.Signals().ScrapedAt)
	if w := p.pick(v); w != 0 {
		t.Errorf("holder full and queued: picked %d, want 0", w)
	}
}

// The approximate tree's capacities evict least recently stored blocks.
func TestApproxTreeEviction(t *testing.T) {
	tr := newApproxTree(2, 1, 0, 4, 0)
	tr.store(0, seq(1, 4), 0)
	tr.store(0, seq(10, 2), 1) // over 4: blocks 1 and 2 go
	if n := tr.match(seq(1, 4), 2)[0]; n != 0 {
		t.Errorf("after eviction of the head: match %d, want 0", n)
	}
	if tr.counts[0] != 4 {
		t.Errorf("count %d, want 4", tr.counts[0])
	}
	g := newApproxTree(2, 1, 0, 0, 3)
	for i, k := range []uint64{1, 2, 1, 3, 4} { // 1 refreshed: 2 is the least recent
		g.store(0, []uint64{k}, int64(i))
	}
	if g.m[1] == nil || g.m[2] != nil || len(g.m) != 3 {
		t.Errorf("global LRU kept %d entries, 1 kept %v, 2 kept %v", len(g.m), g.m[1] != nil, g.m[2] != nil)
	}
}

// Every peer policy runs the synthetic workload to completion, and the cache
// affine ones reuse more cache than round_robin.
func TestPeersSimulate(t *testing.T) {
	reqs := Synthetic(SyntheticConfig{Groups: 8, PromptsPerGrp: 12, SystemBlocks: 4, UserBlocks: 1, Turns: 3, Zipf: 1.2,
		Rate: 2, ThinkSeconds: 5, OutputTokens: 64, SharedSysBlock: true, Seed: 3})
	if err := Keys(reqs, "m", 16); err != nil {
		t.Fatal(err)
	}
	run := func(p, learning string) Result {
		r, err := Run(Config{Policy: p, Learning: learning, GPUs: Heterogeneous(4), RateScale: 2, Model: "m"}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed != len(reqs) || r.TPOTP90 <= 0 {
			t.Fatalf("%s: %d of %d completed, TPOT p90 %v", p, r.Completed, len(reqs), r.TPOTP90)
		}
		t.Logf("%s/%s: hit %.3f ttft p90 %.3f tpot p90 %.4f", p, r.Learning, r.HitRatio, r.TTFTP90, r.TPOTP90)
		return r
	}
	rr := run(PolicyRoundRobin, "")
	for _, p := range PeerPolicies {
		if r := run(p, ""); r.HitRatio <= rr.HitRatio {
			t.Errorf("%s hit %.3f not above round_robin %.3f", p, r.HitRatio, rr.HitRatio)
		}
	}
	for _, p := range []string{PolicyLLMD, PolicyDynamo} {
		if r := run(p, LearnApprox); r.Learning != LearnApprox {
			t.Errorf("%s approx reported learning %q", p, r.Learning)
		}
	}
}
