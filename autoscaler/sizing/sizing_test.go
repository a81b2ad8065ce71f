package sizing

import (
	"errors"
	"math"
	"testing"
)

func TestEngines(t *testing.T) {
	cases := []struct {
		name           string
		rule           Rule
		rate, capacity float64
		want           int
	}{
		{"rate over capacity, rounded up", Rule{SLO: 2}, 7, 2, 4},
		{"exactly full engines", Rule{SLO: 2}, 8, 2, 4},
		{"headroom", Rule{SLO: 2, Headroom: 0.25}, 7, 2, 5},
		{"10% headroom at the benchmark's peak", Rule{SLO: 2, Headroom: 0.1}, 12.0, 2.01, 7},
		{"no load: min", Rule{SLO: 2, Min: 1}, 0, 2, 1},
		{"no load, min 0: scale to zero", Rule{SLO: 2}, 0, 2, 0},
		{"max caps", Rule{SLO: 2, Max: 3}, 100, 2, 3},
		{"huge rate stays bounded", Rule{SLO: 2}, 1e300, 1e-300, MaxEngines},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.rule.Engines(tc.rate, tc.capacity)
			if err != nil || got != tc.want {
				t.Errorf("Engines(%v, %v) = %d, %v; want %d", tc.rate, tc.capacity, got, err, tc.want)
			}
		})
	}
}

func TestEnginesRefusesBrokenSignals(t *testing.T) {
	r := Rule{SLO: 2}
	for _, in := range [][2]float64{{-1, 2}, {math.NaN(), 2}, {math.Inf(1), 2}, {1, 0}, {1, -2}, {1, math.NaN()}} {
		if _, err := r.Engines(in[0], in[1]); !errors.Is(err, ErrNoSignal) {
			t.Errorf("Engines(%v, %v) error %v, want ErrNoSignal", in[0], in[1], err)
		}
	}
}

func TestLearnedCapacity(t *testing.T) {
	r := Rule{SLO: 2} // attainment 0.99: ln(100) ≈ 4.605
	cases := []struct {
		name    string
		rule    Rule
		prefill float64
		want    float64
		err     error
	}{
		{"12k tokens at 48k/s: ρ = 1 − 0.25·4.605/2", r, 0.25, (1 - 0.25*math.Log(100)/2) / 0.25, nil},
		{"attainment 0.9: looser", Rule{SLO: 2, Attainment: 0.9}, 0.25, (1 - 0.25*math.Log(10)/2) / 0.25, nil},
		{"nothing to prefill", r, 0, math.Inf(1), nil},
		{"prefill alone past the SLO", r, 0.5, 0, ErrSLOUnreachable},
		{"broken signal", r, math.NaN(), 0, ErrNoSignal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.rule.LearnedCapacity(tc.prefill)
			if !errors.Is(err, tc.err) || (tc.err == nil && math.Abs(got-tc.want) > 1e-9 && got != tc.want) {
				t.Errorf("LearnedCapacity(%v) = %v, %v; want %v, %v", tc.prefill, got, err, tc.want, tc.err)
			}
		})
	}
	// Slower prefill, less capacity; a tighter SLO, less capacity.
	fast, _ := r.LearnedCapacity(0.1)
	slow, _ := r.LearnedCapacity(0.2)
	tight, _ := Rule{SLO: 1}.LearnedCapacity(0.1)
	if !(fast > slow && fast > tight) {
		t.Errorf("capacity %v (0.1 s) must exceed %v (0.2 s) and %v (SLO 1 s)", fast, slow, tight)
	}
}

func TestValidateNamesTheKey(t *testing.T) {
	cases := []struct {
		rule Rule
		key  string
	}{
		{Rule{SLO: 0}, KeySLO},
		{Rule{SLO: math.NaN()}, KeySLO},
		{Rule{SLO: 1e9}, KeySLO},
		{Rule{SLO: 1, Headroom: -0.1}, KeyHeadroom},
		{Rule{SLO: 1, Headroom: 11}, KeyHeadroom},
		{Rule{SLO: 1, Attainment: 1}, KeyAttainment},
		{Rule{SLO: 1, Min: -1}, KeyMin},
		{Rule{SLO: 1, Max: MaxEngines + 1}, KeyMax},
		{Rule{SLO: 1, Min: 3, Max: 2}, KeyMax},
		{Rule{SLO: 1, Headroom: 0.1, Attainment: 0.99, Min: 1, Max: 8}, ""},
	}
	for _, tc := range cases {
		err := tc.rule.Validate()
		var ce *ConfigError
		switch {
		case tc.key == "" && err != nil:
			t.Errorf("%+v: %v, want valid", tc.rule, err)
		case tc.key != "" && (!errors.As(err, &ce) || ce.Key != tc.key):
			t.Errorf("%+v: %v, want an error naming %s", tc.rule, err, tc.key)
		}
	}
}
