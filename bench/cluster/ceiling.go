package cluster

import (
	"cmp"
	"slices"
	"time"

	"github.com/oasis-llm/oasis/sim/engine"
)

// Ceiling bounds the request rate at which a cluster can serve a trace within
// a TPOT SLO, whichever router places the requests. It is the rate at which
// the GPUs, by their step-time models (engine.Timing), just compute the
// trace's work: every reused prefix served by an infinite shared cache (the
// oracle's hits, OracleHitRatio), so only the rest of each prompt is
// prefilled, every output token after the first decoded, and each GPU given
// the share of prefill and decode it does best.
//
// A step that prefills P tokens and decodes D sequences (D at most the
// engine's MaxNumSeqs, S) takes t = b + P·pp + D·pd (StepBase,
// PerPrefillToken, PerDecodeSeq). A decoding request waits one step per
// token, so it meets a TPOT of T when the steps it decodes in average at
// most T long. A GPU decoding d tokens/s and prefilling p tokens/s in steps
// of t spends b/t of its time on step overhead:
//
//	d·pd + p·pp ≤ 1 − b/t,   t ≤ T,   d·t ≤ S
//
// Rate takes t = T, or t = S/d where the batch bound needs shorter steps.
// The SLO's percentiles are p90s, so a run may pass a little above Rate by
// letting a tenth of its requests decode in longer steps or queue, and a
// finite run by the work it drains after its last arrival (below; diurnal
// on 16 H100s passes it by 9%). WorkRate drops the step
// overhead and the batch bound (b = 0: the GPUs compute tokens back to back,
// at any TPOT): no cluster sustains a higher rate, since the trace's work
// at it exceeds what the GPUs compute in the same time. A finite run can
// pass above it by the share of its work it drains after the last arrival,
// a burst-bound run (Result.BurstBound) by much more.
//
// Neither counts the TTFT SLO, the KV the running batches hold, or that the
// oracle's one cache serves a prefix any worker computed: a trace whose
// prompts queue past the TTFT SLO before the GPUs are busy, whose batches
// fill the KV (preempting), or whose reuse is spread over combinations no
// one worker holds (RAG's documents) ends well below them.
type Ceiling struct {
	// Rate is the ceiling at the TPOT SLO, requests/s, and Scale the
	// trace's rate scale there (Config.RateScale).
	Rate  float64 `json:"rate_rps"`
	Scale float64 `json:"rate_scale"`
	// WorkRate is the ceiling without step overhead, and WorkScale its
	// rate scale.
	WorkRate  float64 `json:"work_rate_rps"`
	WorkScale float64 `json:"work_rate_scale"`
	// PrefillTokens is the mean prompt tokens per request the oracle's
	// cache does not serve, DecodeTokens the mean output tokens after the
	// first (which the prefill step samples).
	PrefillTokens float64 `json:"prefill_tokens_per_request"`
	DecodeTokens  float64 `json:"decode_tokens_per_request"`
}

// CeilingOf computes the ceiling of reqs on gpus at the engine's block size
// and a TPOT SLO of tpot. A GPU whose StepBase is tpot or more adds nothing
// to Rate; without requests or GPUs the ceiling is zero.
func CeilingOf(reqs []*Request, gpus []GPU, blockSize int, tpot time.Duration) Ceiling {
	if len(reqs) == 0 || len(gpus) == 0 {
		return Ceiling{}
	}
	hit, total := oracleHits(reqs, blockSize)
	var out int64
	for _, r := range reqs {
		out += int64(r.Output - 1)
	}
	n := float64(len(reqs))
	c := Ceiling{PrefillTokens: float64(total-hit) / n, DecodeTokens: float64(out) / n}
	maxSeqs := engine.DefaultConfig().MaxNumSeqs // what Run's engines use
	c.Rate = c.maxRate(frontiers(gpus, tpot.Seconds(), maxSeqs))
	c.WorkRate = c.maxRate(frontiers(gpus, 0, 0))
	if span := Span(reqs); span > 0 {
		c.Scale, c.WorkScale = c.Rate*span/n, c.WorkRate*span/n
	}
	return c
}

// frontier is one GPU's (or, summed, the cluster's) most prefill tokens/s
// at each decode rate: prefill at zero decode, less slope·d over segments
// taken in order of slope (each GPU's frontier is concave, so the cluster
// serves each further decode token where it costs the least prefill).
type frontier struct {
	prefill  float64
	segments []segment
}

// segment: over length decode tokens/s, each costs slope prefill tokens/s.
type segment struct{ slope, length float64 }

// frontiers sums the GPUs' frontiers for steps of at most tpot seconds and
// at most maxSeqs decoding sequences; tpot 0 drops the step overhead and the
// batch bound.
func frontiers(gpus []GPU, tpot float64, maxSeqs int) frontier {
	var f frontier
	for _, g := range gpus {
		b, pp, pd := g.Timing.StepBase.Seconds(), g.Timing.PerPrefillToken.Seconds(), g.Timing.PerDecodeSeq.Seconds()
		if pp <= 0 || pd <= 0 {
			continue // a model without per-token costs bounds nothing
		}
		if tpot == 0 {
			f.prefill += 1 / pp
			f.segments = append(f.segments, segment{pd / pp, 1 / pd})
			continue
		}
		busy := 1 - b/tpot // the share of time left after step overhead
		if busy <= 0 {
			continue
		}
		f.prefill += busy / pp
		s := float64(maxSeqs)
		if full := s / tpot; busy/pd > full {
			// Past S/T tokens/s the steps shorten to t = S/d, each paying b:
			// prefill (1 − d·(b/S + pd))/pp, down to zero at 1/(b/S + pd).
			f.segments = append(f.segments, segment{pd / pp, full},
				segment{(b/s + pd) / pp, 1/(b/s+pd) - full})
			continue
		}
		f.segments = append(f.segments, segment{pd / pp, busy / pd})
	}
	slices.SortFunc(f.segments, func(a, b segment) int { return cmp.Compare(a.slope, b.slope) })
	return f
}

// prefillAt is the most prefill tokens/s left while decoding d tokens/s, and
// false when the GPUs cannot decode d at all.
func (f frontier) prefillAt(d float64) (float64, bool) {
	p := f.prefill
	for _, s := range f.segments {
		if d <= 0 {
			break
		}
		take := min(d, s.length)
		p -= take * s.slope
		d -= take
	}
	return max(0, p), d <= 1e-9*(1+f.prefill)
}

// maxRate bisects for the highest request rate whose decode and prefill
// tokens the frontier holds.
func (c Ceiling) maxRate(f frontier) float64 {
	if c.PrefillTokens <= 0 || f.prefill <= 0 {
		return 0
	}
	lo, hi := 0.0, f.prefill/c.PrefillTokens
	for range 100 {
		r := (lo + hi) / 2
		if p, ok := f.prefillAt(r * c.DecodeTokens); ok && p >= r*c.PrefillTokens {
			lo = r
		} else {
			hi = r
		}
	}
	return lo
}
