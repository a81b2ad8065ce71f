package scoring

import (
	"context"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/prefixindex"
)

// blocksHeld is a prefix source where each worker holds a number of the
// prompt's first blocks.
type blocksHeld map[string]int

func (blocksHeld) Keys(dst []uint64, _ string, bs int, tokens []uint32) ([]uint64, error) {
	for i := 0; i+bs <= len(tokens); i += bs {
		dst = append(dst, uint64(i+1))
	}
	return dst, nil
}

func (b blocksHeld) Match(keys []uint64, _ prefixindex.TierWeights, out []prefixindex.Match) []prefixindex.Match {
	for w, n := range b {
		n = min(n, len(keys))
		out = append(out, prefixindex.Match{Worker: w, Blocks: n, Weighted: float64(n)})
	}
	return out
}

func pdWorker(id, proto string, inFlight int, engine *[3]float64) *Worker {
	w := worker(id, inFlight, engine, -1)
	w.PDProtocol = proto
	return w
}

func TestPickPair(t *testing.T) {
	cases := []struct {
		name    string
		held    blocksHeld
		prefill []*Worker
		decode  []*Worker
		want    [2]string // prefill, decode; "" for ErrNoWorker
	}{
		{"one of each", nil, []*Worker{pdWorker("p", "vllm", 0, nil)}, []*Worker{pdWorker("d", "vllm", 0, nil)}, [2]string{"p", "d"}},
		{"protocols must match", nil,
			[]*Worker{pdWorker("p-sgl", "sglang", 0, nil), pdWorker("p-vllm", "vllm", 5, nil)},
			[]*Worker{pdWorker("d-vllm", "vllm", 0, nil)}, [2]string{"p-vllm", "d-vllm"}},
		{"no shared protocol", nil, []*Worker{pdWorker("p", "sglang", 0, nil)}, []*Worker{pdWorker("d", "vllm", 0, nil)}, [2]string{}},
		{"prefill side: prefix overlap", blocksHeld{"p-warm": 4},
			[]*Worker{pdWorker("p-cold", "vllm", 0, nil), pdWorker("p-warm", "vllm", 0, nil)},
			[]*Worker{pdWorker("d", "vllm", 0, nil)}, [2]string{"p-warm", "d"}},
		{"prefill side: queued prefill beats overlap", blocksHeld{"p-warm": 1},
			[]*Worker{pdWorker("p-cold", "vllm", 0, nil), queued(pdWorker("p-warm", "vllm", 0, nil), 200_000)},
			[]*Worker{pdWorker("d", "vllm", 0, nil)}, [2]string{"p-cold", "d"}},
		{"decode side: load", nil, []*Worker{pdWorker("p", "vllm", 0, nil)},
			[]*Worker{pdWorker("d-busy", "vllm", 6, nil), pdWorker("d-idle", "vllm", 0, nil)}, [2]string{"p", "d-idle"}},
		{"decode side: free KV", nil, []*Worker{pdWorker("p", "vllm", 0, nil)},
			[]*Worker{pdWorker("d-full", "vllm", 0, eng(0, 0, 0.95)), pdWorker("d-free", "vllm", 0, eng(0, 0, 0.1))}, [2]string{"p", "d-free"}},
		{"decode side ignores prefix", blocksHeld{"d-warm": 4}, []*Worker{pdWorker("p", "vllm", 0, nil)},
			[]*Worker{pdWorker("d-warm", "vllm", 4, nil), pdWorker("d-idle", "vllm", 0, nil)}, [2]string{"p", "d-idle"}},
		{"empty side", nil, nil, []*Worker{pdWorker("d", "vllm", 0, nil)}, [2]string{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			reg, err := RouterRegistry(tc.held)
			must.NoError(t, err)
			req := &Request{Model: "m", Tokenize: func(context.Context, *Request) ([]uint32, error) {
				return make([]uint32, 64), nil
			}}
			p, err := NewSelector(SelectorConfig{Registry: reg}).PickPair(context.Background(), req, tc.prefill, tc.decode)
			if tc.want[0] == "" {
				must.ErrorIs(t, err, ErrNoWorker)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, [2]string{p.Prefill.ID, p.Decode.ID})
			// The prefix match covered both sides.
			for _, w := range append(append([]*Worker{}, tc.prefill...), tc.decode...) {
				n, ok := req.UncachedTokens(w)
				must.True(t, ok)
				must.Eq(t, int64(64-16*min(tc.held[w.ID], 4)), n)
			}
		})
	}
}

// TestPickPairWithoutCacheTerms: a registry without prefix and ttft scores
// the prefill side by load.
func TestPickPairWithoutCacheTerms(t *testing.T) {
	reg, err := NewRegistry(BuiltinTerms()...)
	must.NoError(t, err)
	p, err := NewSelector(SelectorConfig{Registry: reg}).PickPair(context.Background(), &Request{Model: "m"},
		[]*Worker{pdWorker("p-busy", "vllm", 3, nil), pdWorker("p-idle", "vllm", 0, nil)},
		[]*Worker{pdWorker("d", "vllm", 0, nil)})
	must.NoError(t, err)
	must.Eq(t, "p-idle", p.Prefill.ID)
}

func queued(w *Worker, tokens int64) *Worker {
	w.Live.StartPrefill(tokens)
	return w
}
