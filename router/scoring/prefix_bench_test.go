package scoring

import (
	"context"
	"fmt"
	"testing"

	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/shoenig/test/must"
)

// BenchmarkPickPrefixGuard is one routing decision with the router's default
// weights (ttft, prefix, load, power) over 64 workers and a 256-block prompt
// that every worker holds in part (worker i: i×4 blocks), at uneven loads
// (worker i: i mod 16 requests in flight, so the guard withdraws credit from
// some of them), for each hot-spot ε: the guard's cost must not depend on it.
func BenchmarkPickPrefixGuard(b *testing.B) {
	const n, blocks = 64, 256
	p := prompt(1, blocks)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("w%d", i)
	}
	s := newPrefixState(b, ids...)
	ws := make([]*Worker, n)
	for i := range ws {
		ws[i] = bsWorker(ids[i], i%16)
		hold(b, s, ids[i], p[:(i*4)*testBS])
	}
	weights := map[string]float64{"ttft": 2, "prefix": 1, "load": 0.2, "power": 1.3}
	for _, eps := range []float64{0.25, 0.5, 1} {
		b.Run(fmt.Sprintf("eps=%g", eps), func(b *testing.B) {
			term := NewPrefixTerm(s)
			term.LoadSlack = eps
			reg, err := NewRegistry(append(BuiltinTerms(), term, NewTTFTTerm(term))...)
			must.NoError(b, err)
			sel := NewSelector(SelectorConfig{Registry: reg})
			cfg := Config{Policy: Weighted, Weights: weights}
			must.NoError(b, reg.Validate(cfg))
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := sel.Pick(ctx, cfg, tokReq(p), ws); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPickInflight is BenchmarkPickPrefixGuard's decision (ε 0.5) over
// 64 workers with KV events whose prompts are known both from their events
// (worker i: i×4 blocks) and from the router's in-flight record (i×4 + 2):
// the cost of matching the second index and folding the two.
func BenchmarkPickInflight(b *testing.B) {
	const n, blocks = 64, 256
	p := prompt(1, blocks)
	s := cachestate.New(cachestate.Config{})
	b.Cleanup(func() { must.NoError(b, s.Close()) })
	var engs []cachestate.Engine
	for i := range n {
		engs = append(engs, cachestate.Engine{ID: fmt.Sprintf("w%d", i), Model: "m", Address: "127.0.0.1:1", BlockSize: testBS, KVEvents: "tcp://127.0.0.1:1"})
	}
	s.Sync(context.Background(), engs)
	keys, err := s.Keys(nil, "m", testBS, p)
	must.NoError(b, err)
	ws := make([]*Worker, n)
	for i, e := range engs {
		ws[i] = bsWorker(e.ID, i%16)
		must.NoError(b, s.EventIndex().Store(e.ID, prefixindex.TierGPU, keys[:i*4], 0))
		s.Record(e.ID, keys[:min(i*4+2, blocks)])
	}
	term := NewPrefixTerm(s)
	reg, err := NewRegistry(append(BuiltinTerms(), term, NewTTFTTerm(term))...)
	must.NoError(b, err)
	sel := NewSelector(SelectorConfig{Registry: reg})
	cfg := Config{Policy: Weighted, Weights: map[string]float64{"ttft": 2, "prefix": 1, "load": 0.2, "power": 1.3}}
	must.NoError(b, reg.Validate(cfg))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sel.Pick(ctx, cfg, tokReq(p), ws); err != nil {
			b.Fatal(err)
		}
	}
}
