package cluster

import (
	"testing"
	"time"
)

// Two datacenters of two workers each, every request arriving in dc1: at a
// rate dc1 cannot serve alone, the oasis federation (the real Decide and
// spill budget) forwards and keeps TTFT p90 below local-only's; at a low
// rate it forwards (almost) nothing and matches local-only.
func TestFederationSpillsUnderLoad(t *testing.T) {
	reqs := Synthetic(SyntheticConfig{Groups: 8, PromptsPerGrp: 16, SystemBlocks: 4, UserBlocks: 1, Turns: 3, Zipf: 1.2,
		Rate: 2, ThinkSeconds: 5, OutputTokens: 64, SharedSysBlock: true, Seed: 3})
	if err := Keys(reqs, "m", 16); err != nil {
		t.Fatal(err)
	}
	run := func(policy string, scale float64) FedResult {
		c := FedConfig{Config: Config{GPUs: Heterogeneous(2), Policy: PolicyOasis, Model: "m", RateScale: scale},
			DCs: 2, RTT: 30 * time.Millisecond, Skew: 1, Federation: policy, MaxInFlight: 2 * 16}
		r, err := RunFederated(c, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed != len(reqs) {
			t.Fatalf("%s: %d of %d completed", policy, r.Completed, len(reqs))
		}
		t.Logf("%s scale %g: ttft p50 %.3f p90 %.3f p99 %.3f forwarded %d (%.1f%%) served %v thr %.2f", policy, scale,
			r.TTFTP50, r.TTFTP90, r.TTFTP99, r.Forwarded, r.ForwardedPct, r.Served, r.Throughput)
		return r
	}
	localHi, oasisHi := run(FedLocal, 8), run(FedOasis, 8)
	if oasisHi.Forwarded == 0 {
		t.Error("oasis forwarded nothing while dc1 was saturated")
	}
	if oasisHi.TTFTP90 >= localHi.TTFTP90 {
		t.Errorf("saturated dc1: oasis TTFT p90 %.3f s not below local-only %.3f s", oasisHi.TTFTP90, localHi.TTFTP90)
	}
	localLo, oasisLo := run(FedLocal, 0.5), run(FedOasis, 0.5)
	if oasisLo.ForwardedPct > 1 {
		t.Errorf("low load: oasis forwarded %.1f%% of requests", oasisLo.ForwardedPct)
	}
	if oasisLo.TTFTP90 > localLo.TTFTP90*1.1 {
		t.Errorf("low load: oasis TTFT p90 %.3f s above local-only %.3f s", oasisLo.TTFTP90, localLo.TTFTP90)
	}
}
