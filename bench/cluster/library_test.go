package cluster

import (
	"math"
	"reflect"
	"strings"
	"testing"
)

func gen(t *testing.T, spec string) []*Request {
	t.Helper()
	reqs, err := LoadSpec(spec)
	if err != nil {
		t.Fatal(err)
	}
	return reqs
}

// Every generator is deterministic in its knobs and seed, makes the requests
// asked for in arrival order, valid for ReadTrace's checks, and a different
// seed makes a different trace.
func TestGeneratorsDeterministic(t *testing.T) {
	for _, g := range Generators {
		t.Run(g.Name, func(t *testing.T) {
			a := gen(t, "gen:"+g.Name+":n=300")
			b := gen(t, "gen:"+g.Name+":n=300")
			c := gen(t, "gen:"+g.Name+":n=300,seed=2")
			if len(a) != 300 {
				t.Fatalf("%d requests, want 300", len(a))
			}
			if !reflect.DeepEqual(a, b) {
				t.Error("same knobs and seed gave different traces")
			}
			if reflect.DeepEqual(a, c) {
				t.Error("seed 2 gave the same trace as seed 1")
			}
			for i, r := range a {
				if r.Input <= 0 || r.Output <= 0 || len(r.HashIDs)*TraceBlock < r.Input || r.Input <= (len(r.HashIDs)-1)*TraceBlock {
					t.Fatalf("request %d: input %d output %d over %d blocks", i, r.Input, r.Output, len(r.HashIDs))
				}
				if i > 0 && r.Arrival < a[i-1].Arrival {
					t.Fatalf("request %d arrives before request %d", i, i-1)
				}
			}
		})
	}
}

func meanInput(reqs []*Request) float64 {
	var s float64
	for _, r := range reqs {
		s += float64(r.Input)
	}
	return s / float64(len(reqs))
}

func firstBlocks(reqs []*Request) map[int64]int {
	out := map[int64]int{}
	for _, r := range reqs {
		out[r.HashIDs[0]]++
	}
	return out
}

// Each knob moves what it names.
func TestGeneratorKnobs(t *testing.T) {
	oracle := func(spec string) float64 { return OracleHitRatio(gen(t, spec), 16) }
	tests := []struct {
		name  string
		check func(t *testing.T)
	}{
		{"tenants: one system prompt per tenant", func(t *testing.T) {
			if n := len(firstBlocks(gen(t, "gen:tenants:n=2000,tenants=10"))); n != 10 {
				t.Errorf("%d distinct system prompts, want 10", n)
			}
		}},
		{"tenants: a longer system prompt reuses more", func(t *testing.T) {
			if lo, hi := oracle("gen:tenants:system=2"), oracle("gen:tenants:system=16"); hi <= lo {
				t.Errorf("oracle %.3f at 16 blocks not above %.3f at 2", hi, lo)
			}
		}},
		{"skewed: the hot tenant takes its share", func(t *testing.T) {
			reqs := gen(t, "gen:skewed:n=4000,hot=0.5")
			top := 0
			for _, n := range firstBlocks(reqs) {
				top = max(top, n)
			}
			if share := float64(top) / float64(len(reqs)); math.Abs(share-0.5) > 0.03 {
				t.Errorf("hot tenant share %.3f, want 0.5", share)
			}
		}},
		{"chat: a turn's prompt extends the conversation's previous one", func(t *testing.T) {
			reqs := gen(t, "gen:chat:n=500,turns=6")
			extended := 0
			for i, r := range reqs {
				for _, p := range reqs[:i] {
					if len(p.HashIDs) < len(r.HashIDs) && len(p.HashIDs) > 2 && reflect.DeepEqual(p.HashIDs, r.HashIDs[:len(p.HashIDs)]) {
						extended++
						break
					}
				}
			}
			if extended < len(reqs)/2 {
				t.Errorf("%d of %d requests extend an earlier one", extended, len(reqs))
			}
			if lo, hi := meanInput(gen(t, "gen:chat:turns=2")), meanInput(gen(t, "gen:chat:turns=12")); hi <= lo {
				t.Errorf("mean input %.0f at 12 turns not above %.0f at 2", hi, lo)
			}
		}},
		{"rag: more skewed popularity reuses more", func(t *testing.T) {
			if lo, hi := oracle("gen:rag:zipf=1.05"), oracle("gen:rag:zipf=2"); hi <= lo {
				t.Errorf("oracle %.3f at zipf 2 not above %.3f at 1.05", hi, lo)
			}
			for _, r := range gen(t, "gen:rag:n=50,k=3,docblocks=4,system=1,question=1") {
				if len(r.HashIDs) != 1+3*4+1 {
					t.Fatalf("%d blocks, want 14", len(r.HashIDs))
				}
			}
		}},
		{"agent: long context, short turns, high reuse", func(t *testing.T) {
			if lo, hi := meanInput(gen(t, "gen:agent:context=8")), meanInput(gen(t, "gen:agent:context=32")); hi < lo+20*TraceBlock {
				t.Errorf("mean input %.0f at 32 context blocks not well above %.0f at 8", hi, lo)
			}
			if o := oracle("gen:agent"); o < 0.8 {
				t.Errorf("oracle %.3f, want > 0.8 for tool loops on one context", o)
			}
		}},
		{"mixed: the long share", func(t *testing.T) {
			reqs := gen(t, "gen:mixed:n=4000,long=0.25,longmin=16,system=2")
			long := 0
			for _, r := range reqs {
				if len(r.HashIDs) >= 18 {
					long++
				}
			}
			if share := float64(long) / float64(len(reqs)); math.Abs(share-0.25) > 0.03 {
				t.Errorf("long share %.3f, want 0.25", share)
			}
		}},
		{"diurnal: the swing and the bursts spread per-window counts", func(t *testing.T) {
			spread := func(spec string) float64 {
				reqs := gen(t, spec)
				counts := map[int64]float64{}
				for _, r := range reqs {
					counts[r.Arrival/30000]++
				}
				var m, v float64
				for _, c := range counts {
					m += c
				}
				m /= float64(len(counts))
				for _, c := range counts {
					v += (c - m) * (c - m)
				}
				return math.Sqrt(v/float64(len(counts))) / m
			}
			flat, day := spread("gen:diurnal:n=4000,amp=0,burst=1"), spread("gen:diurnal:n=4000,amp=0.9,burst=1,period=300")
			bursty := spread("gen:diurnal:n=4000,amp=0,burst=8,burstlen=15,burstevery=120")
			if day < 2*flat || bursty < 2*flat {
				t.Errorf("coefficient of variation: flat %.2f, diurnal %.2f, bursty %.2f", flat, day, bursty)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.check)
	}
}

func TestParseGenErrors(t *testing.T) {
	for _, spec := range []string{"gen:nope", "gen:rag:docs", "gen:rag:docs=x", "gen:rag:bogus=1", "gen:rag:n=0", "gen:rag:rate=-1"} {
		if _, err := LoadSpec(spec); err == nil {
			t.Errorf("%s: no error", spec)
		}
	}
}

// Every library entry loads (the shared Mooncake trace where present) and
// names its family; the shipped trace is gunzipped.
func TestLibraryLoads(t *testing.T) {
	for _, name := range LibraryNames() {
		if Family(name) == "file" {
			t.Errorf("%s has no family", name)
		}
		if !strings.HasPrefix(name, "gen:") && name != "mooncake-synthetic" {
			continue
		}
		reqs, err := LoadSpec(name)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(reqs) == 0 {
			t.Errorf("%s: empty", name)
		}
	}
	reqs, err := LoadSpec("mooncake-synthetic")
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3993 {
		t.Errorf("mooncake-synthetic: %d requests, want 3993", len(reqs))
	}
}

// A short generator trace at a high rate scale arrives in a fraction of a
// second and drains for seconds: burst-bound. The same trace at the
// generator's own rate, or a long one at the high rate, is not.
func TestBurstBound(t *testing.T) {
	run := func(spec string, scale float64) Result {
		t.Helper()
		reqs := gen(t, spec)
		if err := Keys(reqs, "m", 16); err != nil {
			t.Fatal(err)
		}
		r, err := Run(Config{Policy: PolicyRoundRobin, GPUs: Heterogeneous(16), RateScale: scale, Model: "m"}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s at %g: arrivals %.1f s, drain %.1f s", spec, scale, r.ArrivalSeconds(), r.DrainSeconds())
		return r
	}
	for _, c := range []struct {
		spec  string
		scale float64
		burst bool
	}{
		{"gen:diurnal:n=600", 256, true},
		{"gen:diurnal:n=600", 1, false},
		{"gen:diurnal:n=6000", 16, false},
	} {
		if got := run(c.spec, c.scale).BurstBound(); got != c.burst {
			t.Errorf("%s at scale %g: burst-bound %v, want %v", c.spec, c.scale, got, c.burst)
		}
	}
	if (Result{}).BurstBound() {
		t.Error("a run with no rate is burst-bound")
	}
}
