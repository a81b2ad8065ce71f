package cluster

import (
	"math"
	"testing"
)

// Four routers share four workers on a shared-prefix workload: every
// request completes whatever they share; with approximate learning, each
// router learning from only its own quarter of the decisions reuses less
// cache than one router does, and sharing the prefix records (router/peers'
// Outbox, with each message) wins most of it back; with KV events the routers'
// hit ratio matches one router's within a few points.
func TestRouters(t *testing.T) {
	reqs := Synthetic(SyntheticConfig{Groups: 8, PromptsPerGrp: 12, SystemBlocks: 4, UserBlocks: 1, Turns: 3, Zipf: 1.2,
		Rate: 2, ThinkSeconds: 5, OutputTokens: 64, SharedSysBlock: true, Seed: 3})
	if err := Keys(reqs, "m", 16); err != nil {
		t.Fatal(err)
	}
	run := func(c Config) Result {
		t.Helper()
		c.GPUs = Heterogeneous(4)
		c.RateScale = 2
		c.Model = "m"
		c.Policy = PolicyOasis
		c.Weights = map[string]float64{"prefix": 1, "load": 1}
		r, err := Run(c, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if r.Completed != len(reqs) {
			t.Fatalf("%d routers: %d of %d completed", c.Routers, r.Completed, len(reqs))
		}
		if c.Routers > 1 && (r.Routers != c.Routers || r.ShareLoads != c.ShareLoads || r.SharePrefixes != c.SharePrefixes) {
			t.Fatalf("result says %d routers, loads %v, prefixes %v; configured %+v", r.Routers, r.ShareLoads, r.SharePrefixes, c)
		}
		t.Logf("%d routers %s loads=%v prefixes=%v: hit %.3f ttft p90 %.3f", max(c.Routers, 1), r.Learning, c.ShareLoads, c.SharePrefixes, r.HitRatio, r.TTFTP90)
		return r
	}
	one := run(Config{Learning: LearnApprox})
	alone := run(Config{Learning: LearnApprox, Routers: 4})
	loads := run(Config{Learning: LearnApprox, Routers: 4, ShareLoads: true})
	shared := run(Config{Learning: LearnApprox, Routers: 4, ShareLoads: true, SharePrefixes: true})
	// The messages follow peers.Schedule: some, never more than one per
	// router per min interval (10 ms), each priced.
	perSec := float64(loads.PeerMessages) / 4 / loads.Makespan
	if loads.PeerMessages == 0 || perSec > 100 || loads.PeerBytes < loads.PeerMessages*20 || alone.PeerMessages != 0 {
		t.Errorf("messages: %d (%.1f a second per router), %d bytes; without sharing %d", loads.PeerMessages, perSec, loads.PeerBytes, alone.PeerMessages)
	}
	if alone.HitRatio >= one.HitRatio {
		t.Errorf("4 routers learning alone hit %.3f, not below one router's %.3f", alone.HitRatio, one.HitRatio)
	}
	if shared.HitRatio <= loads.HitRatio {
		t.Errorf("sharing prefix records: hit %.3f, not above loads only %.3f", shared.HitRatio, loads.HitRatio)
	}
	evOne := run(Config{Learning: LearnEvents})
	evMany := run(Config{Learning: LearnEvents, Routers: 4, ShareLoads: true})
	if evMany.HitRatio < evOne.HitRatio-0.05 {
		t.Errorf("with events 4 routers hit %.3f, one router %.3f", evMany.HitRatio, evOne.HitRatio)
	}
	// One Live per worker for all routers (the upper bound of sharing):
	// the routers decide as one router does.
	oracle := run(Config{Learning: LearnEvents, Routers: 4, ShareSignals: true})
	if !oracle.ShareSignals || math.Abs(oracle.HitRatio-evOne.HitRatio) > 0.02 || math.Abs(oracle.TTFTP90-evOne.TTFTP90) > 0.1*evOne.TTFTP90 {
		t.Errorf("4 routers sharing one Live per worker: hit %.3f, TTFT p90 %.3f s; one router %.3f, %.3f s", oracle.HitRatio, oracle.TTFTP90,
			evOne.HitRatio, evOne.TTFTP90)
	}
	if _, err := Run(Config{GPUs: Heterogeneous(2), Policy: PolicyLLMD, Routers: 2}, reqs); err == nil {
		t.Error("a peer policy with 2 routers ran; want an error")
	}
}

func TestSpreadTies(t *testing.T) {
	in := []*Request{{Arrival: 0}, {Arrival: 0}, {Arrival: 0}, {Arrival: 0}, {Arrival: 400}, {Arrival: 5000}, {Arrival: 5000}}
	var got []int64
	for _, r := range SpreadTies(in) {
		got = append(got, r.Arrival)
	}
	want := []int64{0, 100, 200, 300, 400, 5000, 5500}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("spread arrivals %v, want %v", got, want)
		}
	}
	if in[1].Arrival != 0 {
		t.Fatal("the input was changed")
	}
}
