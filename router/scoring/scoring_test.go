package scoring

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// worker builds a worker with the given router in-flight count and optional
// engine / power signals; tpj is the per-sequence tokens per joule.
func worker(id string, inFlight int, engine *[3]float64, tpj float64) *Worker {
	w := &Worker{ID: id, Model: "m", Live: NewLive()}
	for range inFlight {
		w.Live.Begin(10)
	}
	if engine != nil {
		w.Live.SetEngine(engine[0], engine[1], engine[2], time.Now())
	}
	if tpj >= 0 {
		w.Live.SetPower(300, tpj*300, tpj*max(1, float64(inFlight)), tpj)
	}
	return w
}

func eng(running, waiting, kv float64) *[3]float64 { return &[3]float64{running, waiting, kv} }

func scores(t Term, ws ...*Worker) []float64 {
	out := make([]float64, len(ws))
	t.Score(context.Background(), &Request{Model: "m"}, ws, out)
	return out
}

func approx(t *testing.T, want, got []float64) {
	t.Helper()
	must.Eq(t, len(want), len(got))
	for i := range want {
		if math.Abs(want[i]-got[i]) > 1e-9 {
			t.Fatalf("score[%d]: want %v, got %v (all %v)", i, want[i], got[i], got)
		}
	}
}

func TestLoadTerm(t *testing.T) {
	cases := []struct {
		name    string
		workers []*Worker
		want    []float64
	}{
		{"all idle", []*Worker{worker("a", 0, nil, -1), worker("b", 0, nil, -1)}, []float64{1, 1}},
		{"router in-flight", []*Worker{worker("a", 0, nil, -1), worker("b", 1, nil, -1), worker("c", 3, nil, -1)}, []float64{1, 0.5, 0.25}},
		{"engine queue counts when larger", []*Worker{worker("a", 1, eng(4, 3, 0), -1), worker("b", 1, eng(0, 0, 0), -1)}, []float64{2.0 / 8, 1}},
		{"relative at high load", []*Worker{worker("a", 100, nil, -1), worker("b", 101, nil, -1)}, []float64{1, 101.0 / 102}},
		{"single", []*Worker{worker("a", 5, nil, -1)}, []float64{1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { approx(t, tc.want, scores(LoadTerm{}, tc.workers...)) })
	}
}

func TestKVCapacityTerm(t *testing.T) {
	cases := []struct {
		name    string
		workers []*Worker
		want    []float64
	}{
		{"usage inverted", []*Worker{worker("a", 0, eng(0, 0, 0.25), -1), worker("b", 0, eng(0, 0, 1), -1)}, []float64{0.75, 0}},
		{"unknown is neutral", []*Worker{worker("a", 0, nil, -1), worker("b", 0, eng(0, 0, 0), -1)}, []float64{Neutral, 1}},
		{"out of range clamped", []*Worker{worker("a", 0, eng(0, 0, 1.5), -1), worker("b", 0, eng(0, 0, -1), -1)}, []float64{0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { approx(t, tc.want, scores(KVCapacityTerm{}, tc.workers...)) })
	}
}

func TestPowerTerm(t *testing.T) {
	cases := []struct {
		name    string
		workers []*Worker
		want    []float64
	}{
		{"relative to most efficient", []*Worker{worker("a", 0, nil, 2), worker("b", 0, nil, 4), worker("c", 0, nil, 1)}, []float64{0.5, 1, 0.25}},
		// A request joining a batch of 3 shares its steps four ways: 4× an
		// idle GPU of the same kind, 2× an idle one twice as efficient.
		{"joining a batch", []*Worker{worker("idle", 0, nil, 1), worker("busy", 3, nil, 1), worker("fast", 0, nil, 2)}, []float64{0.25, 1, 0.5}},
		// Past B = 16 the preference falls, to nothing at 2B: work spreads.
		{"past B it falls", []*Worker{worker("b15", 15, nil, 1), worker("b23", 23, nil, 1), worker("b40", 40, nil, 1), worker("idle", 0, nil, 1)}, []float64{1, 0.5, 0, 1.0 / 16}},
		{"engine load counts", []*Worker{worker("a", 0, eng(5, 2, 0.1), 1), worker("b", 1, nil, 1)}, []float64{1, 0.25}},
		{"unknown is neutral", []*Worker{worker("a", 0, nil, -1), worker("b", 0, nil, 3)}, []float64{Neutral, 1}},
		{"none measured", []*Worker{worker("a", 0, nil, 0), worker("b", 0, nil, -1)}, []float64{Neutral, Neutral}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { approx(t, tc.want, scores(PowerTerm{}, tc.workers...)) })
	}
}

func newSelector(t *testing.T, extra ...Term) *Selector {
	reg, err := NewRegistry(append(BuiltinTerms(), extra...)...)
	must.NoError(t, err)
	return NewSelector(SelectorConfig{Registry: reg})
}

func TestRoundRobin(t *testing.T) {
	s := newSelector(t)
	ws := []*Worker{worker("a", 9, nil, -1), worker("b", 0, nil, -1), worker("c", 0, nil, -1)}
	var got []string
	for range 6 {
		d, err := s.Pick(context.Background(), Config{Policy: RoundRobin}, &Request{Model: "m"}, ws)
		must.NoError(t, err)
		got = append(got, d.Worker.ID)
	}
	must.Eq(t, []string{"a", "b", "c", "a", "b", "c"}, got)
	// Each model has its own position.
	d, err := s.Pick(context.Background(), Config{Policy: RoundRobin}, &Request{Model: "other"}, ws)
	must.NoError(t, err)
	must.Eq(t, "a", d.Worker.ID)
}

func TestLeastLoad(t *testing.T) {
	cases := []struct {
		name    string
		workers []*Worker
		want    map[string]bool // acceptable picks
	}{
		{"fewest in flight", []*Worker{worker("a", 3, nil, -1), worker("b", 1, nil, -1), worker("c", 2, nil, -1)}, map[string]bool{"b": true}},
		{"engine queue seen", []*Worker{worker("a", 0, eng(5, 5, 0), -1), worker("b", 1, nil, -1)}, map[string]bool{"b": true}},
		{"ties either", []*Worker{worker("a", 1, nil, -1), worker("b", 1, nil, -1), worker("c", 2, nil, -1)}, map[string]bool{"a": true, "b": true}},
	}
	s := newSelector(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			seen := map[string]bool{}
			for range 200 {
				d, err := s.Pick(context.Background(), Config{Policy: LeastLoad}, &Request{Model: "m"}, tc.workers)
				must.NoError(t, err)
				must.True(t, tc.want[d.Worker.ID], must.Sprintf("picked %s", d.Worker.ID))
				seen[d.Worker.ID] = true
			}
			must.Eq(t, len(tc.want), len(seen), must.Sprint("every tied worker gets picked"))
		})
	}
}

// fixedTerm scores workers by a fixed table, to test weighting in isolation.
type fixedTerm struct {
	name string
	by   map[string]float64
}

func (f fixedTerm) Name() string { return f.name }
func (f fixedTerm) Score(_ context.Context, _ *Request, ws []*Worker, out []float64) {
	for i, w := range ws {
		out[i] = f.by[w.ID]
	}
}

func TestWeighted(t *testing.T) {
	x := fixedTerm{"x", map[string]float64{"a": 1, "b": 0, "c": 0.5}}
	y := fixedTerm{"y", map[string]float64{"a": 0, "b": 1, "c": 0.6}}
	s := newSelector(t, x, y)
	ws := []*Worker{worker("a", 0, nil, -1), worker("b", 0, nil, -1), worker("c", 0, nil, -1)}
	cases := []struct {
		name    string
		weights map[string]float64
		want    string
		total   []float64
	}{
		{"x only", map[string]float64{"x": 1}, "a", []float64{1, 0, 0.5}},
		{"y only", map[string]float64{"y": 2}, "b", []float64{0, 2, 1.2}},
		{"blend favours balanced", map[string]float64{"x": 1, "y": 1}, "c", []float64{1, 1, 1.1}},
		{"zero weight ignored", map[string]float64{"x": 0, "y": 1}, "b", []float64{0, 1, 0.6}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := Config{Policy: Weighted, Weights: tc.weights}
			must.NoError(t, s.reg.Validate(cfg))
			d, err := s.Pick(context.Background(), cfg, &Request{Model: "m"}, ws)
			must.NoError(t, err)
			must.Eq(t, tc.want, d.Worker.ID)
			approx(t, tc.total, d.Scores)
		})
	}
}

func TestWeightedRandomTieBreak(t *testing.T) {
	s := newSelector(t)
	ws := []*Worker{worker("a", 0, nil, -1), worker("b", 0, nil, -1), worker("c", 0, nil, -1)}
	count := map[string]int{}
	for range 3000 {
		d, err := s.Pick(context.Background(), Config{Policy: Weighted, Weights: map[string]float64{"load": 1}}, &Request{Model: "m"}, ws)
		must.NoError(t, err)
		count[d.Worker.ID]++
	}
	for _, id := range []string{"a", "b", "c"} {
		must.Between(t, 800, count[id], 1200)
	}
}

// A seeded tie-break repeats its picks exactly; the default source does not
// have to.
func TestWeightedSeededTieBreak(t *testing.T) {
	reg, err := NewRegistry(BuiltinTerms()...)
	must.NoError(t, err)
	ws := []*Worker{worker("a", 0, nil, -1), worker("b", 0, nil, -1), worker("c", 0, nil, -1)}
	picks := func(seed uint64) string {
		s := NewSelector(SelectorConfig{Registry: reg, TieBreak: rand.New(rand.NewPCG(seed, 1)).IntN})
		var b strings.Builder
		for range 64 {
			d, err := s.Pick(context.Background(), Config{Policy: Weighted, Weights: map[string]float64{"load": 1}}, &Request{Model: "m"}, ws)
			must.NoError(t, err)
			b.WriteString(d.Worker.ID)
		}
		return b.String()
	}
	must.Eq(t, picks(7), picks(7))
	must.NotEq(t, picks(7), picks(8))
	for _, id := range []string{"a", "b", "c"} {
		must.StrContains(t, picks(7), id) // still spread over the tied workers
	}
}

func TestPickNoWorker(t *testing.T) {
	s := newSelector(t)
	for _, p := range []string{RoundRobin, LeastLoad, Weighted} {
		_, err := s.Pick(context.Background(), Config{Policy: p, Weights: map[string]float64{"load": 1}}, &Request{Model: "m"}, nil)
		must.True(t, errors.Is(err, ErrNoWorker))
	}
}

func TestValidate(t *testing.T) {
	reg, err := NewRegistry(BuiltinTerms()...)
	must.NoError(t, err)
	cases := []struct {
		name string
		cfg  Config
		err  string
	}{
		{"round robin", Config{Policy: RoundRobin}, ""},
		{"least load", Config{Policy: LeastLoad}, ""},
		{"weighted", Config{Policy: Weighted, Weights: map[string]float64{"load": 1, "power": 0.2, "kv_capacity": 0}}, ""},
		{"missing policy", Config{}, "policy: missing"},
		{"unknown policy", Config{Policy: "fastest"}, `unknown "fastest"`},
		{"unknown term", Config{Policy: Weighted, Weights: map[string]float64{"lod": 1}}, `unknown term "lod"`},
		{"negative weight", Config{Policy: Weighted, Weights: map[string]float64{"load": -1}}, "weights.load"},
		{"NaN weight", Config{Policy: Weighted, Weights: map[string]float64{"load": math.NaN()}}, "weights.load"},
		{"no positive weight", Config{Policy: Weighted, Weights: map[string]float64{"load": 0}}, "at least one weight"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := reg.Validate(tc.cfg)
			if tc.err == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, tc.err)
		})
	}
}

func TestRegistryDuplicate(t *testing.T) {
	_, err := NewRegistry(LoadTerm{}, LoadTerm{})
	must.ErrorContains(t, err, "twice")
}

func TestPromptTokensOnce(t *testing.T) {
	calls := 0
	r := &Request{Tokenize: func(context.Context, *Request) ([]uint32, error) {
		calls++
		return []uint32{1, 2, 3}, nil
	}}
	for range 3 {
		toks, err := r.PromptTokens(context.Background())
		must.NoError(t, err)
		must.Eq(t, []uint32{1, 2, 3}, toks)
	}
	must.Eq(t, 1, calls)
	toks, err := (&Request{}).PromptTokens(context.Background())
	must.NoError(t, err)
	must.Nil(t, toks)
}

func TestLiveBeginEnd(t *testing.T) {
	l := NewLive()
	end := l.Begin(100)
	end2 := l.Begin(50)
	must.Eq(t, int64(2), l.Snapshot().InFlight)
	must.Eq(t, int64(150), l.Snapshot().InFlightTokens)
	end()
	end() // idempotent
	must.Eq(t, int64(1), l.Snapshot().InFlight)
	end2()
	must.Eq(t, int64(0), l.Snapshot().InFlightTokens)
}

func TestLiveEnterLeave(t *testing.T) {
	l := NewLive()
	l.Enter(10)
	l.Enter(5)
	s := l.Snapshot()
	if s.InFlight != 2 || s.InFlightTokens != 15 {
		t.Fatalf("after two Enters: in flight %d, tokens %d; want 2, 15", s.InFlight, s.InFlightTokens)
	}
	l.Leave(10)
	s = l.Snapshot()
	if s.InFlight != 1 || s.InFlightTokens != 5 {
		t.Fatalf("after Leave: in flight %d, tokens %d; want 1, 5", s.InFlight, s.InFlightTokens)
	}
}

func TestLiveAttach(t *testing.T) {
	l := NewLive()
	must.Nil(t, l.Attached())
	type state struct{ n int }
	a, b := &state{1}, &state{2}
	l.Attach(a)
	must.Eq(t, any(a), l.Attached())
	l.Attach(b)
	must.Eq(t, any(b), l.Attached())
}

func TestEjection(t *testing.T) {
	l := NewLive()
	now := time.Unix(1000, 0)
	must.False(t, l.ConnectFailed(now, 3, 10*time.Second))
	must.False(t, l.ConnectFailed(now, 3, 10*time.Second))
	must.False(t, l.Ejected(now))
	must.True(t, l.ConnectFailed(now, 3, 10*time.Second)) // third in a row
	must.True(t, l.Ejected(now.Add(9*time.Second)))
	must.False(t, l.Ejected(now.Add(10*time.Second)))
	// The probe after the ejection fails: ejected again at once.
	later := now.Add(11 * time.Second)
	must.True(t, l.ConnectFailed(later, 3, 10*time.Second))
	must.False(t, l.ConnectFailed(later, 3, 10*time.Second)) // already ejected: re-armed, not new
	must.True(t, l.Ejected(later.Add(5*time.Second)))
	// A request that connects ends it and restarts the count.
	l.Connected()
	must.False(t, l.Ejected(later))
	must.False(t, l.ConnectFailed(later, 3, 10*time.Second))
	// after ≤ 0: never.
	never := NewLive()
	for range 10 {
		must.False(t, never.ConnectFailed(now, 0, time.Second))
	}
	must.False(t, never.Ejected(now))
}
