package scoring

import (
	"context"
	"testing"

	"github.com/shoenig/test/must"
)

// TestPrefixTermAdapterDomain: a request naming a LoRA adapter matches only
// blocks cached for that adapter; the base model's blocks of the same
// tokens do not count, nor another adapter's.
func TestPrefixTermAdapterDomain(t *testing.T) {
	s := newPrefixState(t, "a", "b")
	p := prompt(1, 8)
	hold(t, s, "a", p) // the base model's blocks
	keys, err := s.AdapterKeys(nil, "m", "sql", testBS, p)
	must.NoError(t, err)
	s.Record("b", keys) // the adapter's
	term := NewPrefixTerm(s)
	ws := []*Worker{bsWorker("a", 0), bsWorker("b", 0)}
	for _, w := range ws {
		w.Adapters = []string{"sql", "chat"}
	}
	out := make([]float64, 2)
	for _, tc := range []struct {
		model string
		want  []float64
	}{
		{"m", []float64{1, 0}},
		{"sql", []float64{0, 1}},
		{"chat", []float64{0, 0}},
	} {
		req := tokReq(p)
		req.Model = tc.model
		term.Score(context.Background(), req, ws, out)
		approx(t, tc.want, out)
	}
}
