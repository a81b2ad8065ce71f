package cluster

import (
	"math"
	"testing"
	"time"
)

// uniqueReqs returns n requests one second apart, each with its own hash
// ids (nothing reused), in input and out tokens.
func uniqueReqs(n, in, out int) []*Request {
	reqs := make([]*Request, n)
	id := int64(0)
	for i := range reqs {
		r := &Request{Arrival: int64(i) * 1000, Input: in, Output: out}
		for k := 0; k*TraceBlock < in; k++ {
			id++
			r.HashIDs = append(r.HashIDs, id)
		}
		reqs[i] = r
	}
	return reqs
}

func TestCeilingOf(t *testing.T) {
	const tpot = 100 * time.Millisecond
	// One H100 (b 6 ms, pp 30 µs, pd 50 µs, at most 1,024 sequences a step).
	// 16 prompt tokens and 100 decode tokens a request: at 100 ms steps the
	// decode needs more than 1,024 sequences, so the steps shorten to
	// 1,024/d and each request costs 100·pd + 16·pp + 100·b/1024.
	h100Decode := 1 / (100*50e-6 + 16*30e-6 + 100*6e-3/1024)
	h100Work := 1 / (100*50e-6 + 16*30e-6)
	// Prefill only (one output token, sampled by the prefill step) on an
	// H100 and an L40S (b 23 ms, pp 82 µs): their busy shares over pp.
	prefillOnly := ((1-6.0/100)/30e-6 + (1-23.0/100)/82e-6) / 1000
	prefillWork := (1/30e-6 + 1/82e-6) / 1000
	shared := []*Request{ // the second request reuses the first's block: 16 of 512 tokens prefilled
		{Arrival: 0, Input: 512, Output: 1, HashIDs: []int64{7}},
		{Arrival: 1000, Input: 512, Output: 1, HashIDs: []int64{7}},
	}
	for _, c := range []struct {
		name                  string
		reqs                  []*Request
		gpus                  []GPU
		tpot                  time.Duration
		rate, work            float64
		prefillTok, decodeTok float64
	}{
		{"decode past the batch bound", uniqueReqs(10, 16, 101), []GPU{H100}, tpot, h100Decode, h100Work, 16, 100},
		{"prefill only, two GPUs", uniqueReqs(10, 1000, 1), []GPU{H100, L40S}, tpot, prefillOnly, prefillWork, 1000, 0},
		{"a step base above the SLO adds nothing", uniqueReqs(10, 1000, 1), []GPU{H100, L40S}, 20 * time.Millisecond,
			(1 - 6.0/20) / 30e-6 / 1000, prefillWork, 1000, 0},
		{"oracle hits are not prefilled", shared, []GPU{H100}, tpot, (1 - 6.0/100) / 30e-6 / 264, 1 / 30e-6 / 264, 264, 0},
		{"no requests", nil, []GPU{H100}, tpot, 0, 0, 0, 0},
		{"no GPUs", uniqueReqs(3, 16, 2), nil, tpot, 0, 0, 0, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := CeilingOf(c.reqs, c.gpus, 16, c.tpot)
			near := func(field string, got, want float64) {
				t.Helper()
				if math.Abs(got-want) > 1e-6*(1+want) {
					t.Errorf("%s = %.6f, want %.6f", field, got, want)
				}
			}
			near("Rate", got.Rate, c.rate)
			near("WorkRate", got.WorkRate, c.work)
			near("PrefillTokens", got.PrefillTokens, c.prefillTok)
			near("DecodeTokens", got.DecodeTokens, c.decodeTok)
			if span := Span(c.reqs); span > 0 {
				near("Scale", got.Scale, got.Rate*span/float64(len(c.reqs)))
			}
		})
	}
}

// refPrefill is the reference for one GPU: the most prefill tokens/s it does
// while decoding d tokens/s, searching step durations t directly in the step
// model (D = d·t sequences at most maxSeqs, P = (t − b − D·pd)/pp tokens).
func refPrefill(g GPU, d, tpot float64, maxSeqs int) float64 {
	b, pp, pd := g.Timing.StepBase.Seconds(), g.Timing.PerPrefillToken.Seconds(), g.Timing.PerDecodeSeq.Seconds()
	best := -1.0
	for i := 1; i <= 4000; i++ {
		step := tpot * float64(i) / 4000
		seqs := d * step
		if seqs > float64(maxSeqs) {
			continue
		}
		if p := (step - b - seqs*pd) / pp; p >= 0 {
			best = max(best, p/step)
		}
	}
	return best
}

// TestCeilingMatchesReference checks the frontier against a direct search of
// the step model on two and three GPUs: every split of the decode between
// them, every step length.
func TestCeilingMatchesReference(t *testing.T) {
	const tpot = 0.1
	for _, c := range []struct {
		name string
		gpus []GPU
		reqs []*Request
	}{
		{"H100 and L40S, decode-heavy", []GPU{H100, L40S}, uniqueReqs(10, 64, 301)},
		{"H100 and A100, prefill-heavy", []GPU{H100, A100}, uniqueReqs(10, 4000, 51)},
		{"three GPUs, balanced", []GPU{H100, A100, L40S}, uniqueReqs(10, 1500, 257)},
	} {
		t.Run(c.name, func(t *testing.T) {
			ceil := CeilingOf(c.reqs, c.gpus, 16, 100*time.Millisecond)
			feasible := func(r float64) bool {
				d := r * ceil.DecodeTokens
				// every split of d over the GPUs, on a grid of 1/grid
				grid := 400 / len(c.gpus)
				var best float64
				var split func(i int, left float64, p float64)
				split = func(i int, left, p float64) {
					if i == len(c.gpus)-1 {
						if q := refPrefill(c.gpus[i], left, tpot, 1024); q >= 0 {
							best = max(best, p+q)
						}
						return
					}
					for k := 0; k <= grid; k++ {
						share := d * float64(k) / float64(grid)
						if share > left {
							break
						}
						if q := refPrefill(c.gpus[i], share, tpot, 1024); q >= 0 {
							split(i+1, left-share, p+q)
						}
					}
				}
				split(0, d, 0)
				return best >= r*ceil.PrefillTokens
			}
			// The reference, coarser than the frontier, reaches just below it
			// and not above.
			if !feasible(ceil.Rate * 0.99) {
				t.Errorf("the reference cannot serve 0.99 × Rate (%.3f req/s)", ceil.Rate)
			}
			if feasible(ceil.Rate * 1.001) {
				t.Errorf("the reference serves 1.001 × Rate (%.3f req/s): the ceiling is not the most the step model allows", ceil.Rate)
			}
		})
	}
}

// TestCeilingBoundsTheSimulator runs the simulator around the ceiling: a
// sustained trace meets the SLO well below Rate and fails above WorkRate.
func TestCeilingBoundsTheSimulator(t *testing.T) {
	reqs := gen(t, "gen:tenants:n=3000")
	if err := Keys(reqs, "m", 16); err != nil {
		t.Fatal(err)
	}
	gpus := []GPU{H100, H100}
	ceil := CeilingOf(reqs, gpus, 16, 100*time.Millisecond)
	if !(ceil.Rate > 0 && ceil.Rate < ceil.WorkRate) {
		t.Fatalf("ceiling %+v: want 0 < Rate < WorkRate", ceil)
	}
	slo := DefaultRoutingSLO()
	for _, c := range []struct {
		scale float64
		meets bool
	}{
		{ceil.Scale * 0.6, true},
		{ceil.WorkScale * 1.1, false},
	} {
		r, err := Run(Config{Policy: PolicyOasis, GPUs: gpus, RateScale: c.scale, Model: "m"}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("scale %.2f (%.1f req/s; ceiling %.1f, work %.1f): TTFT p90 %.2f s, TPOT p90 %.1f ms, burst-bound %v",
			c.scale, r.Rate, ceil.Rate, ceil.WorkRate, r.TTFTP90, r.TPOTP90*1000, r.BurstBound())
		if slo.Met(r) != c.meets {
			t.Errorf("scale %.2f (%.2f × Rate): SLO met %v, want %v", c.scale, c.scale/ceil.Scale, slo.Met(r), c.meets)
		}
	}
}
