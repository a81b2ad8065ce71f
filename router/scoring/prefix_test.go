package scoring

import (
	"context"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/shoenig/test/must"
)

const testBS = 4

func prompt(start, blocks int) []uint32 {
	out := make([]uint32, blocks*testBS)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

func tokReq(tokens []uint32) *Request {
	return &Request{Model: "m", Tokenize: func(context.Context, *Request) ([]uint32, error) { return tokens, nil }}
}

// newPrefixState returns a cache state following approximate-learning
// workers (no events), so the tests can put blocks where they want.
func newPrefixState(t testing.TB, ids ...string) *cachestate.State {
	s := cachestate.New(cachestate.Config{})
	t.Cleanup(func() { must.NoError(t, s.Close()) })
	var engs []cachestate.Engine
	for _, id := range ids {
		engs = append(engs, cachestate.Engine{ID: id, Model: "m", Address: "127.0.0.1:1", BlockSize: testBS})
	}
	s.Sync(context.Background(), engs)
	return s
}

func hold(t testing.TB, s *cachestate.State, id string, tokens []uint32) {
	keys, err := s.Keys(nil, "m", testBS, tokens)
	must.NoError(t, err)
	s.Record(id, keys)
}

func bsWorker(id string, inFlight int) *Worker {
	w := worker(id, inFlight, nil, -1)
	w.BlockSize = testBS
	return w
}

func TestPrefixTermOverlap(t *testing.T) {
	s := newPrefixState(t, "a", "b", "c")
	p := prompt(1, 8)
	hold(t, s, "a", p[:4*testBS])
	hold(t, s, "b", p)
	term := NewPrefixTerm(s)
	ws := []*Worker{bsWorker("a", 0), bsWorker("b", 0), bsWorker("c", 0)}
	out := make([]float64, 3)
	term.Score(context.Background(), tokReq(p), ws, out)
	approx(t, []float64{0.5, 1, 0}, out)

	// A partial trailing block does not count as a request block.
	term.Score(context.Background(), tokReq(append(append([]uint32{}, p...), 1, 2)), ws, out)
	approx(t, []float64{0.5, 1, 0}, out)

	// Tier weights: halve the GPU weight.
	term.SetTierWeights(prefixindex.TierWeights{GPU: 0.5, CPU: 0.25})
	term.Score(context.Background(), tokReq(p), ws, out)
	approx(t, []float64{0.25, 0.5, 0}, out)
}

func TestPrefixTermNoTokensIsNeutral(t *testing.T) {
	s := newPrefixState(t, "a")
	term := NewPrefixTerm(s)
	out := []float64{0}
	term.Score(context.Background(), &Request{Model: "m"}, []*Worker{bsWorker("a", 0)}, out)
	approx(t, []float64{Neutral}, out)
	// Shorter than one block: nothing to match either.
	term.Score(context.Background(), tokReq([]uint32{1, 2}), []*Worker{bsWorker("a", 0)}, out)
	approx(t, []float64{Neutral}, out)
}

func TestPrefixTermGuardBound(t *testing.T) {
	s := newPrefixState(t, "a", "b", "c", "d")
	p := prompt(1, 4)
	hold(t, s, "a", p)
	hold(t, s, "b", p)
	cases := []struct {
		name  string
		slack float64
		loads [4]int
		want  []float64
	}{
		// total 12, n 4: bound ⌈1.25·13/4⌉ = 5; a (10) is over it, b (2) is not.
		{"overloaded holder loses credit", 0.25, [4]int{10, 2, 0, 0}, []float64{0, 1, 0, 0}},
		{"guard off", -1, [4]int{10, 2, 0, 0}, []float64{1, 1, 0, 0}},
		// Below the floor (4) affinity always holds.
		{"floor", 0.25, [4]int{3, 0, 0, 0}, []float64{1, 1, 0, 0}},
		// total 19: ε 0.25 bounds at ⌈1.25·20/4⌉ = 7, so a (7: 1.47× the mean, 4.75) loses its
		// credit; the default ε 0.5 bounds at ⌈1.5·20/4⌉ = 8 and a keeps it.
		{"ε 0.25 withdraws at 1.25× the mean", 0.25, [4]int{7, 4, 4, 4}, []float64{0, 1, 0, 0}},
		{"default ε keeps it below 1.5× the mean", DefaultLoadSlack, [4]int{7, 4, 4, 4}, []float64{1, 1, 0, 0}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			term := NewPrefixTerm(s)
			term.LoadSlack = tc.slack
			ws := make([]*Worker, 4)
			for i, id := range []string{"a", "b", "c", "d"} {
				ws[i] = bsWorker(id, tc.loads[i])
			}
			out := make([]float64, 4)
			term.Score(context.Background(), tokReq(p), ws, out)
			approx(t, tc.want, out)
		})
	}
}

// TestSharedSystemPromptDoesNotHotSpot sends a burst of requests that all
// start with one long shared system prompt (plus a short distinct suffix)
// and never finish, learning each decision like the router does. Pure
// affinity piles every request on the first holder; the guarded weighted
// policy keeps the busiest worker within the guard's bound at the burst's
// last pick, ⌈(1+ε)·burst/n⌉, while still reusing the prompt on the workers
// it spread to.
//
// With the default ε = 0.5 that bound is 1.5× the mean (at most 12 of 64
// requests on one of 8 workers, against all 64 with pure affinity), the
// max/mean ≤ 1.5 this test asserted when ε was 0.25 (which measured 10/8).
// ε went from 0.25 to 0.5 because the routing benchmark on the Mooncake trace
// showed the 1.25× bound costing cache hits at high load (16 identical H100s:
// 35.9 req/s at the SLO with 0.25, 43.4 with 0.5, SGLang's cache_aware 42.6;
// BENCHMARKS.md, "Routing on the Mooncake trace"). ε 1 would double the hot
// holder's share (16 of 64 here) for no throughput gain there.
func TestSharedSystemPromptDoesNotHotSpot(t *testing.T) {
	const n, burst = 8, 64
	bound := math.Ceil((1 + DefaultLoadSlack) * burst / n)
	must.LessEq(t, burst/4, bound, must.Sprint("the default guard still keeps a hot prefix to a fraction of the burst"))
	system := prompt(1, 30)
	run := func(slack float64, weights map[string]float64, powerMeasured bool) (maxIn, meanIn float64, holders int) {
		ids := make([]string, n)
		ws := make([]*Worker, n)
		for i := range ws {
			ids[i] = fmt.Sprintf("w%d", i)
			ws[i] = bsWorker(ids[i], 0)
			if powerMeasured {
				ws[i].Live.SetPower(300, 30, 0.1, 0.1) // equal GPUs
			}
		}
		s := newPrefixState(t, ids...)
		term := NewPrefixTerm(s)
		term.LoadSlack = slack
		reg, err := NewRegistry(append(BuiltinTerms(), term, NewTTFTTerm(term))...)
		must.NoError(t, err)
		sel := NewSelector(SelectorConfig{Registry: reg})
		cfg := Config{Policy: Weighted, Weights: weights}
		must.NoError(t, reg.Validate(cfg))
		for r := 0; r < burst; r++ {
			tokens := append(append([]uint32{}, system...), prompt(10000+r*100, 2)...)
			req := tokReq(tokens)
			d, err := sel.Pick(context.Background(), cfg, req, ws)
			must.NoError(t, err)
			// What the gateway does for a forwarded request that has not
			// answered yet.
			d.Worker.Live.Begin(1)
			if u, ok := req.UncachedTokens(d.Worker); ok {
				d.Worker.Live.StartPrefill(u)
			}
			hold(t, s, d.Worker.ID, tokens)
		}
		keys, err := s.Keys(nil, "m", testBS, system)
		must.NoError(t, err)
		for _, m := range s.Match(keys, prefixindex.DefaultTierWeights(), nil) {
			if m.Blocks == len(keys) {
				holders++
			}
		}
		for _, w := range ws {
			l := w.Signals().Load()
			maxIn = max(maxIn, l)
			meanIn += l / n
		}
		return maxIn, meanIn, holders
	}

	maxIn, _, holders := run(-1, map[string]float64{"prefix": 1}, false)
	must.Eq(t, float64(burst), maxIn, must.Sprint("pure affinity sends the whole burst to the first holder"))
	must.Eq(t, 1, holders)

	maxIn, meanIn, holders := run(DefaultLoadSlack, map[string]float64{"prefix": 1, "load": 1}, false)
	must.LessEq(t, bound, maxIn, must.Sprintf("guarded imbalance max %v mean %v", maxIn, meanIn))
	must.Greater(t, 1, holders)

	// The router's default weights (policy.DefaultWeights) add ttft, which
	// sees the prompts queued on the holder, and power, neutral until the
	// workers have generated.
	defaults := map[string]float64{"ttft": 2, "prefix": 1, "load": 0.2, "power": 1.3}
	maxIn, meanIn, holders = run(DefaultLoadSlack, defaults, false)
	t.Logf("default weights, power unmeasured: max %v mean %v holders %d", maxIn, meanIn, holders)
	must.LessEq(t, bound, maxIn, must.Sprintf("default weights imbalance max %v mean %v", maxIn, meanIn))
	must.Greater(t, 1, holders)
	// Once power is measured the term consolidates on purpose (a request
	// joining a batch costs fewer joules per token), but only up to a batch
	// of 2B, where its preference has fallen to nothing.
	maxIn, meanIn, holders = run(DefaultLoadSlack, defaults, true)
	t.Logf("default weights, power measured: max %v mean %v holders %d", maxIn, meanIn, holders)
	must.LessEq(t, 2*DefaultPowerBatch, maxIn)
	must.Greater(t, 1, holders)
}

// The term leaves what it matched on the request, for the router's metrics and approximate
// learning after the pick, so neither digests nor matches the prompt again.
func TestPrefixTermLeavesItsResultOnTheRequest(t *testing.T) {
	s := newPrefixState(t, "a", "b")
	p := prompt(1, 8)
	hold(t, s, "a", p[:3*testBS])
	term := NewPrefixTerm(s)
	req := tokReq(p)
	_, _, ok := req.PrefixResult("a")
	must.False(t, ok, must.Sprint("no result before the term scored"))

	term.Score(context.Background(), req, []*Worker{bsWorker("a", 0), bsWorker("b", 0)}, make([]float64, 2))
	keys, matched, ok := req.PrefixResult("a")
	must.True(t, ok)
	want, err := s.Keys(nil, "m", testBS, p)
	must.NoError(t, err)
	must.Eq(t, want, keys)
	must.Eq(t, 3, matched)
	_, matched, _ = req.PrefixResult("b")
	must.Eq(t, 0, matched)
}

// TestInflightKeepsNewPrefixTogether: with KV events, two requests sharing a
// prefix nobody holds yet, back to back (the first one's events not yet
// arrived), go to the same worker when the router records its decisions in
// flight; without that record the second sees nobody holding the prefix and
// goes to the idle worker, recomputing it.
func TestInflightKeepsNewPrefixTogether(t *testing.T) {
	cases := []struct {
		name     string
		inflight time.Duration
		weights  map[string]float64
		same     bool
	}{
		{"prefix and load, in-flight record", 0, map[string]float64{"prefix": 1, "load": 0.2}, true},
		{"default weights, in-flight record", 0, map[string]float64{"ttft": 2, "prefix": 1, "load": 0.2, "power": 1.3}, true},
		{"prefix and load, events alone", -1, map[string]float64{"prefix": 1, "load": 0.2}, false},
		{"default weights, events alone", -1, map[string]float64{"ttft": 2, "prefix": 1, "load": 0.2, "power": 1.3}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := cachestate.New(cachestate.Config{InflightTTL: tc.inflight})
			t.Cleanup(func() { must.NoError(t, s.Close()) })
			// Event-driven engines whose events never arrive in this test.
			s.Sync(context.Background(), []cachestate.Engine{
				{ID: "a", Model: "m", Address: "127.0.0.1:1", BlockSize: testBS, KVEvents: "tcp://127.0.0.1:1"},
				{ID: "b", Model: "m", Address: "127.0.0.1:2", BlockSize: testBS, KVEvents: "tcp://127.0.0.1:2"},
			})
			ws := []*Worker{bsWorker("a", 0), bsWorker("b", 0)}
			term := NewPrefixTerm(s)
			reg, err := NewRegistry(append(BuiltinTerms(), term, NewTTFTTerm(term))...)
			must.NoError(t, err)
			sel := NewSelector(SelectorConfig{Registry: reg})
			cfg := Config{Policy: Weighted, Weights: tc.weights}
			must.NoError(t, reg.Validate(cfg))
			p := prompt(7, 32)
			var picked []string
			for range 2 {
				req := tokReq(p)
				d, err := sel.Pick(context.Background(), cfg, req, ws)
				must.NoError(t, err)
				// What the gateway does for a forwarded request.
				d.Worker.Live.Begin(int64(len(p)))
				if u, ok := req.UncachedTokens(d.Worker); ok {
					d.Worker.Live.StartPrefill(u)
				}
				hold(t, s, d.Worker.ID, p)
				picked = append(picked, d.Worker.ID)
			}
			must.Eq(t, tc.same, picked[0] == picked[1], must.Sprintf("picked %v", picked))
		})
	}
}
