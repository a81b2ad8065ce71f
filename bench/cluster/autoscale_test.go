package cluster

import (
	"math"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/autoscaler/sizing"
)

func TestDiurnalShapesTheRateAndKeepsOrder(t *testing.T) {
	reqs := make([]*Request, 3000)
	for i := range reqs {
		reqs[i] = &Request{Arrival: int64(i), Input: i}
	}
	day := time.Hour
	out := Diurnal(reqs, day, 0.8)
	thirds := [3]int{}
	for i, r := range out {
		if r.Input != i || (i > 0 && r.Arrival < out[i-1].Arrival) {
			t.Fatalf("request %d out of order or changed", i)
		}
		thirds[min(int(r.Arrival*3/day.Milliseconds()), 2)]++
	}
	if reqs[10].Arrival != 10 {
		t.Fatal("Diurnal changed its input")
	}
	// λ ∝ 1 + 0.8·sin(2πt/T − π/2): the middle third holds (1/3 + 0.8·√3/(2π)) of the day's requests.
	want := 1.0/3 + 0.8*math.Sqrt(3)/(2*math.Pi)
	if got := float64(thirds[1]) / float64(len(out)); math.Abs(got-want) > 0.01 {
		t.Errorf("middle third holds %.3f of the requests, want %.3f", got, want)
	}
	if thirds[0] != thirds[2] && math.Abs(float64(thirds[0]-thirds[2])) > 2 {
		t.Errorf("morning %d and evening %d differ", thirds[0], thirds[2])
	}
}

// history builds samples one second apart with fn giving each one's signals.
func history(n int, fn func(i int) Sample) *History {
	h := &History{}
	for i := range n {
		s := fn(i)
		s.At = time.Duration(i+1) * time.Second
		h.Samples = append(h.Samples, s)
	}
	return h
}

// TestRuleScalerIsTheSizingRule pins the shipped fleet to autoscaler/sizing: at every evaluation
// its count is sizing.Rule.Engines of the window's arrival rate (and, learned, of the window's
// prefill time), the same call the strategy plugin makes on its check's query.
func TestRuleScalerIsTheSizingRule(t *testing.T) {
	rule := sizing.Rule{SLO: 2, Headroom: 0.1, Min: 1, Max: 20}
	cases := []struct {
		name     string
		capacity float64
		perSec   int
		tokens   int64   // uncached prompt tokens per tick
		rate     float64 // median learned prefill rate
	}{
		{"profiled, peak", 2.01, 12, 0, 0},
		{"profiled, trough", 2.01, 1, 0, 0},
		{"learned: 12 req/s of 4k uncached tokens at 40k tokens/s", 0, 12, 12 * 4000, 40000},
		{"learned: slower prefill, more engines", 0, 12, 12 * 4000, 30000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := &RuleScaler{Rule: rule, Capacity: tc.capacity, EvalInterval: 10 * time.Second, Window: time.Minute}
			h := history(60, func(int) Sample {
				return Sample{Engines: 3, Serving: 3, Arrivals: tc.perSec, PrefillTokens: tc.tokens, PrefillRate: tc.rate}
			})
			capacity := tc.capacity
			if capacity == 0 {
				c, err := rule.LearnedCapacity(float64(tc.tokens) / float64(tc.perSec) / tc.rate)
				if err != nil {
					t.Fatal(err)
				}
				capacity = c
			}
			want, err := rule.Engines(float64(tc.perSec), capacity)
			if err != nil {
				t.Fatal(err)
			}
			if got := s.Decide(h); got != want {
				t.Errorf("Decide = %d, sizing.Rule.Engines = %d", got, want)
			}
		})
	}
}

func TestRuleScalerWaitsForStartsAndCooldowns(t *testing.T) {
	s := &RuleScaler{Rule: sizing.Rule{SLO: 2, Min: 1}, Capacity: 2, EvalInterval: 10 * time.Second,
		Window: time.Minute, CooldownOut: 30 * time.Second, CooldownIn: time.Minute}
	busy := func(engines, serving int) func(int) Sample {
		return func(int) Sample { return Sample{Engines: engines, Serving: serving, Arrivals: 7} }
	}
	if got := s.Decide(history(60, busy(2, 2))); got != 4 { // 7 req/s ÷ 2
		t.Fatalf("first decision %d, want 4", got)
	}
	if got := s.Decide(history(80, busy(3, 3))); got != 3 {
		t.Errorf("inside the scale-out cooldown: %d, want 3 (unchanged)", got)
	}
	if got := s.Decide(history(120, busy(4, 3))); got != 4 {
		t.Errorf("an engine still starting: %d, want 4 (unchanged)", got)
	}
	idle := func(int) Sample { return Sample{Engines: 4, Serving: 4, Arrivals: 1} }
	if got := s.Decide(history(200, idle)); got != 1 {
		t.Errorf("after the cooldown at 1 req/s: %d, want 1", got)
	}
}

func TestPlannerScalerFollowsTheRate(t *testing.T) {
	p := &PlannerScaler{Capacity: 2, AdjustInterval: time.Minute}
	steady := func(perSec int) func(int) Sample {
		return func(int) Sample { return Sample{Engines: 1, Serving: 1, Arrivals: perSec} }
	}
	if got := p.Decide(history(60, steady(7))); got != 4 { // 7 req/s over 2 per engine
		t.Errorf("7 req/s: %d engines, want 4", got)
	}
	if got := p.Decide(history(90, steady(1))); got != 4 {
		t.Errorf("within the interval: %d engines, want 4 (unchanged)", got)
	}
	if got := p.Decide(history(120, steady(1))); got != 1 {
		t.Errorf("1 req/s: %d engines, want 1", got)
	}
	h := &PlannerScaler{Capacity: 2, AdjustInterval: time.Minute, Headroom: 1.25}
	if got := h.Decide(history(60, steady(7))); got != 5 { // 7 × 1.25 over 2 per engine
		t.Errorf("7 req/s with 25%% headroom: %d engines, want 5", got)
	}
}

// scripted scales to counts[i] at the i-th tick after start.
type scripted struct {
	counts []int
	i      int
}

func (s *scripted) Decide(h *History) int {
	n := s.counts[min(s.i, len(s.counts)-1)]
	s.i++
	return n
}

func TestAutoscaledFleetDrainsAndBills(t *testing.T) {
	reqs := Synthetic(SyntheticConfig{Groups: 4, PromptsPerGrp: 10, SystemBlocks: 2, UserBlocks: 1, Turns: 3,
		Rate: 2, ThinkSeconds: 2, OutputTokens: 64, Seed: 5})
	if err := Keys(reqs, "m", 16); err != nil {
		t.Fatal(err)
	}
	run := func(s Scaler, initial int) AutoscaleResult {
		gpus := []GPU{H100, H100, H100, H100}
		cfg := Config{GPUs: gpus, Policy: PolicyOasis, Model: "m", Seed: 1, Autoscale: &AutoscaleConfig{
			Scaler: s, Initial: initial, Min: 1, ColdStart: 5 * time.Second, SLO: DefaultRoutingSLO()}}
		r, a, err := RunAutoscaled(cfg, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed != len(reqs) || a.Requests != len(reqs) {
			t.Fatalf("%d and %d of %d requests completed", r.Completed, a.Requests, len(reqs))
		}
		return a
	}
	static := run(StaticScaler{N: 2}, 2)
	if want := 2 * static.Makespan / 3600; math.Abs(static.GPUHours-want) > 1e-9 {
		t.Errorf("static GPU-hours %.6f, want 2 × makespan %.6f", static.GPUHours, want)
	}
	// Up to 4 at the 3rd second, down to 1 from the 10th: every request still completes (those
	// on removed engines drain there), and the bill lies between 1 and 4 engines' worth.
	counts := []int{1, 1, 4, 4, 4, 4, 4, 4, 4, 1}
	moving := run(&scripted{counts: counts}, 1)
	if moving.MaxEngine != 4 || moving.MinEngine != 1 || moving.ScaleOuts != 1 || moving.ScaleIns != 1 {
		t.Errorf("engines %d–%d, %d outs, %d ins; want 1–4, 1, 1", moving.MinEngine, moving.MaxEngine, moving.ScaleOuts, moving.ScaleIns)
	}
	if lo, hi := moving.Makespan/3600, 4*moving.Makespan/3600; moving.GPUHours <= lo || moving.GPUHours >= hi {
		t.Errorf("GPU-hours %.5f outside (%.5f, %.5f)", moving.GPUHours, lo, hi)
	}
}
