package cluster

import (
	"testing"
	"time"
)

func pdWorkload() []*Request {
	return Synthetic(SyntheticConfig{Groups: 4, PromptsPerGrp: 10, SystemBlocks: 3, UserBlocks: 1, Turns: 3, Zipf: 1.2,
		Rate: 4, ThinkSeconds: 2, OutputTokens: 48, SharedSysBlock: true, Seed: 5})
}

// Every request completes exactly once with all its tokens, in every split; a
// disaggregated request's decode worker computes one prompt token (the last,
// for the first token's logits), never the prompt, and its prefill worker
// produces only the first token.
func TestPDInvariants(t *testing.T) {
	reqs := pdWorkload()
	for _, prefill := range []int{0, 1, 2, 3} {
		s, err := runPD(PDConfig{Workers: 4, Prefill: prefill, RateScale: 4}, reqs)
		if err != nil {
			t.Fatal(err)
		}
		split := s.cfg.Split()
		if s.completed != len(reqs) {
			t.Fatalf("%s: %d of %d completed", split, s.completed, len(reqs))
		}
		for i, f := range s.flights {
			if f.done != 1 || f.tokens != reqs[i].Output {
				t.Fatalf("%s: request %d completed %d times with %d of %d tokens", split, i, f.done, f.tokens, reqs[i].Output)
			}
		}
		var remote, prefilled int64
		for _, w := range s.workers {
			if n := w.eng.Stats().Preemptions; n != 0 {
				t.Fatalf("%s: %d preemptions: the invariants below assume none", split, n)
			}
			switch w.role {
			case roleDecode:
				if w.promptComputed != int64(w.remote) {
					t.Errorf("%s: decode worker %d computed %d prompt tokens for %d requests", split, w.idx, w.promptComputed, w.remote)
				}
				remote += int64(w.remote)
			case rolePrefill:
				if w.remote != 0 {
					t.Errorf("%s: prefill worker %d got %d remote-prefill requests", split, w.idx, w.remote)
				}
				prefilled += w.generated
			}
			if w.pending != 0 || w.active != 0 || w.inflight != 0 {
				t.Errorf("%s: worker %d router state not drained: pending %d active %d in flight %d", split, w.idx, w.pending, w.active, w.inflight)
			}
		}
		if prefill > 0 && (remote != int64(len(reqs)) || prefilled != int64(len(reqs))) {
			t.Errorf("%s: %d requests, %d decoded remotely, %d first tokens from prefill workers", split, len(reqs), remote, prefilled)
		}
		if prefill > 0 && len(s.xfers) != len(reqs) {
			t.Errorf("%s: %d transfers for %d requests", split, len(s.xfers), len(reqs))
		}
		r := s.result(0)
		t.Logf("%s: TTFT p90 %.3fs TPOT p90 %.1fms hit %.3f xfer p90 %.1fms", split, r.TTFTP90, r.TPOTP90*1e3, r.HitRatio, r.XferP90*1e3)
	}
}

// Transfer time is the prompt's KV bytes over the link: it scales with the
// prompt's length, and an idle 1P1D pair adds exactly that to TTFT.
func TestPDTransferScales(t *testing.T) {
	c := PDConfig{Workers: 2, Prefill: 1}
	if err := c.fill(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.transferTime(1000), int64(1000*131072/40); got != want { // ns at 40 GB/s
		t.Fatalf("transfer of 1,000 tokens: %d ns, want %d", got, want)
	}
	if a, b := c.transferTime(1000), c.transferTime(4000); b != 4*a {
		t.Fatalf("transfer of 4,000 tokens %d ns, not 4 × %d", b, a)
	}
	c.LinkGBps = 20
	if a, b := c.transferTime(1000), (PDConfig{LinkGBps: 40, KV: Llama3_8B()}).transferTime(1000); a != 2*b {
		t.Fatalf("half the bandwidth: %d ns, not 2 × %d", a, b)
	}
	// Two requests far apart, no shared prefix: no queueing, no hits.
	reqs := []*Request{{Arrival: 0, Input: 1000, Output: 2, HashIDs: []int64{1, 2}}, {Arrival: 60000, Input: 4000, Output: 2, HashIDs: []int64{3, 4, 5, 6, 7, 8, 9, 10}}}
	s, err := runPD(PDConfig{Workers: 2, Prefill: 1}, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.xfers) != 2 || s.xfers[1] != 4*s.xfers[0] {
		t.Fatalf("transfers %v s: the 4,000-token prompt's is not 4× the 1,000-token one's", s.xfers)
	}
}

// TTFT and TPOT follow the step-time model exactly for a lone request,
// aggregated and disaggregated, and the SLO check uses them.
func TestPDTPOTAccounting(t *testing.T) {
	reqs := []*Request{{Arrival: 0, Input: 32, Output: 5, HashIDs: []int64{1}}}
	tm := H100.Timing
	prefill := tm.StepBase + 32*tm.PerPrefillToken // the whole prompt in one step
	decode := tm.StepBase + tm.PerDecodeSeq        // one sequence decoding
	for _, tc := range []struct {
		prefill int
		ttft    time.Duration
	}{
		{0, prefill},
		// Prefill, transfer, then the decode worker's first step computes
		// the last prompt token only.
		{1, prefill + time.Duration((PDConfig{LinkGBps: 40, KV: Llama3_8B()}).transferTime(32)) + tm.StepBase + tm.PerPrefillToken},
	} {
		for _, slo := range []time.Duration{decode - 1, decode} {
			s, err := runPD(PDConfig{Workers: 2, Prefill: tc.prefill, SLOs: []SLO{{time.Second, slo}}}, reqs)
			if err != nil {
				t.Fatal(err)
			}
			r := s.result(0)
			if got := time.Duration(r.TTFTP50 * 1e9); got.Round(time.Microsecond) != tc.ttft.Round(time.Microsecond) {
				t.Errorf("%s: TTFT %v, want %v", s.cfg.Split(), got, tc.ttft)
			}
			if got := time.Duration(r.TPOTP50 * 1e9); got.Round(time.Microsecond) != decode {
				t.Errorf("%s: TPOT %v, want %v", s.cfg.Split(), got, decode)
			}
			if want := float64(map[bool]int{true: 1, false: 0}[slo >= decode]); r.SLO[0].Attainment != want {
				t.Errorf("%s: TPOT SLO %v: attainment %.0f, want %.0f", s.cfg.Split(), slo, r.SLO[0].Attainment, want)
			}
		}
	}
}

// A sustained rate needs 90% of requests within both SLOs.
func TestSummarisePD(t *testing.T) {
	runs := []PDResult{
		{Split: "agg", Rate: 1, SLO: []SLOResult{{Attainment: 0.99, Goodput: 0.99}}},
		{Split: "agg", Rate: 2, SLO: []SLOResult{{Attainment: 0.91, Goodput: 1.82}}},
		{Split: "agg", Rate: 3, SLO: []SLOResult{{Attainment: 0.7, Goodput: 2.1}}},
		{Split: "2P2D", Rate: 1, SLO: []SLOResult{{Attainment: 0.5, Goodput: 0.5}}},
	}
	got := SummarisePD(runs)
	if len(got) != 2 || got[0].SLO[0].MaxRate != 2 || got[0].SLO[0].Goodput != 1.82 || got[0].SLO[0].BestGoodput != 2.1 || got[1].SLO[0].MaxRate != 0 {
		t.Fatalf("summaries %+v", got)
	}
}
