package scoring

import (
	"context"
	"testing"
	"time"

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

// loadTimes is a Request.AdapterLoad from a table by worker id.
func loadTimes(m map[string]time.Duration) func(*Worker) time.Duration {
	return func(w *Worker) time.Duration { return m[w.ID] }
}

// TestTTFTTermAdapterLoad: a worker that must load the request's LoRA
// adapter first adds the load time to its TTFT estimate, with or without
// prompt tokens; a queue longer than the load on the holder sends the
// request to the worker that would load it.
func TestTTFTTermAdapterLoad(t *testing.T) {
	p := prompt(1, 8)
	sec := time.Second
	u := float64(len(p)) / DefaultPrefillRate // the prompt's own prefill, on both
	cases := []struct {
		name    string
		tokens  bool
		queueA  int64 // prefill tokens pending on a (DefaultPrefillRate per second)
		load    map[string]time.Duration
		noLoads bool // no AdapterLoad at all
		want    []float64
	}{
		{"a holds it, b loads in 1s", true, 0, map[string]time.Duration{"b": sec}, false,
			[]float64{1, (0.25 + u) / (1.25 + u)}},
		{"a is loading: what is left", true, 0, map[string]time.Duration{"a": sec / 4, "b": sec}, false,
			[]float64{1, (0.5 + u) / (1.25 + u)}},
		{"a's 2s queue costs more than b's load", true, 2 * DefaultPrefillRate,
			map[string]time.Duration{"b": sec}, false, []float64{(1.25 + u) / (2.25 + u), 1}},
		{"without tokens: queue and load alone", false, 0, map[string]time.Duration{"b": sec}, false,
			[]float64{1, 0.25 / 1.25}},
		{"without tokens and loads: neutral", false, 0, map[string]time.Duration{}, false,
			[]float64{Neutral, Neutral}},
		{"no AdapterLoad: as before", true, 0, nil, true, []float64{1, 1}},
		{"negative load counts as none", true, 0, map[string]time.Duration{"a": -sec}, false,
			[]float64{1, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := []*Worker{bsWorker("a", 0), bsWorker("b", 0)}
			if tc.queueA > 0 {
				queued(ws[0], tc.queueA)
			}
			req := &Request{Model: "sql"}
			if tc.tokens {
				req = tokReq(p)
			}
			if !tc.noLoads {
				req.AdapterLoad = loadTimes(tc.load)
			}
			out := make([]float64, 2)
			NewTTFTTerm(nil).Score(context.Background(), req, ws, out)
			approx(t, tc.want, out)
		})
	}
}

// TestPickAdapterHolder: under the default policy's weights (router/policy
// DefaultWeights) an adapter request goes to the worker holding the adapter
// even when it is busier, until its prefill queue outweighs the load.
func TestPickAdapterHolder(t *testing.T) {
	s := newSelector(t, NewTTFTTerm(nil))
	cfg := Config{Policy: Weighted, Weights: map[string]float64{"ttft": 2, "load": 0.2, "power": 1.3}}
	cases := []struct {
		name     string
		inFlight int   // on a, the holder
		queueA   int64 // prefill tokens pending on a
		want     string
	}{
		{"idle holder", 0, 0, "a"},
		{"busier holder", 6, 0, "a"},
		{"holder's queue outweighs the load", 6, 3 * DefaultPrefillRate, "b"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ws := []*Worker{worker("a", tc.inFlight, nil, -1), worker("b", 0, nil, -1)}
			if tc.queueA > 0 {
				queued(ws[0], tc.queueA)
			}
			req := tokReq(prompt(1, 8))
			req.Model = "sql"
			req.AdapterLoad = loadTimes(map[string]time.Duration{"b": time.Second})
			d, err := s.Pick(context.Background(), cfg, req, ws)
			must.NoError(t, err)
			must.Eq(t, tc.want, d.Worker.ID, must.Sprintf("scores %v", d.Scores))
		})
	}
}
