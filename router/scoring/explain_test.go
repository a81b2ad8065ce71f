package scoring

import (
	"context"
	"testing"

	"github.com/shoenig/test/must"
)

func TestExplain(t *testing.T) {
	x := fixedTerm{"x", map[string]float64{"a": 1, "b": 0, "c": 0.5}}
	y := fixedTerm{"y", map[string]float64{"a": 0, "b": 1, "c": 0.6}}
	s := newSelector(t, x, y)
	ws := []*Worker{worker("a", 0, nil, -1), worker("b", 0, nil, -1), worker("c", 0, nil, -1)}
	cfg := Config{Policy: Weighted, Weights: map[string]float64{"y": 2, "x": 1, "load": 0}}
	got := s.Explain(context.Background(), cfg, &Request{Model: "m"}, ws, ws[2])
	must.Eq(t, []TermValue{{Name: "x", Weight: 1, Value: 0.5}, {Name: "y", Weight: 2, Value: 0.6}}, got)

	must.Nil(t, s.Explain(context.Background(), Config{Policy: RoundRobin}, &Request{Model: "m"}, ws, ws[0]))
	must.Nil(t, s.Explain(context.Background(), cfg, &Request{Model: "m"}, ws[:2], ws[2]))
}

func TestPrefixMatchTier(t *testing.T) {
	for _, tc := range []struct {
		m    PrefixMatch
		want string
	}{
		{PrefixMatch{Blocks: 4}, "none"},
		{PrefixMatch{Blocks: 4, Matched: 3, GPUBlocks: 3}, "gpu"},
		{PrefixMatch{Blocks: 4, Matched: 3}, "offloaded"},
		{PrefixMatch{Blocks: 4, Matched: 3, GPUBlocks: 1}, "mixed"},
	} {
		must.EqOp(t, tc.want, tc.m.Tier())
	}
	_, ok := (&Request{}).PrefixMatchOn("a")
	must.False(t, ok)
}
