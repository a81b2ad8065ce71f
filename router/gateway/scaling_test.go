package gateway

import (
	"io"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/worker"
)

func TestScalingSignalsPerModelAndRole(t *testing.T) {
	h := newHarnessWith(t, Config{}, nil, nil)
	inst := func(id, model, role, proto string) discovery.Instance {
		m := map[string]string{discovery.MetaModel: model, discovery.MetaRole: role}
		if proto != "" {
			m[discovery.MetaPDProtocol] = proto
		}
		return discovery.Instance{ID: id, Address: "127.0.0.1:1", Meta: m}
	}
	h.pool.Set([]discovery.Instance{
		inst("a1", "agg", "", ""), inst("a2", "agg", "both", ""),
		inst("p1", "pd", "prefill", "vllm"), inst("d1", "pd", "decode", "vllm"), inst("d2", "pd", "decode", "vllm"),
	})
	live := func(id string) *worker.Live {
		for _, w := range h.pool.All() {
			if w.ID == id {
				return w.Live
			}
		}
		t.Fatalf("no worker %s", id)
		return nil
	}
	// a1: two requests in flight; a2: one, and prefill work pending, so its
	// estimated TTFT is the larger (the p90 of two workers is the larger).
	live("a1").Begin(10)
	live("a1").Begin(10)
	live("a2").Begin(10)
	live("a2").StartPrefill(int64(worker.DefaultPrefillRate)) // one second at the default rate
	// The prefill engine's first token taught its rate: 2,048 tokens in 100 ms.
	live("p1").StartPrefill(2048).FirstToken(100 * time.Millisecond)
	// Decode engines report KV usage; the prefill engine was never scraped.
	live("d1").SetEngine(1, 0, 0.2, time.Now())
	live("d2").SetEngine(1, 0, 0.6, time.Now())

	got := map[string]metrics.ScalingSample{}
	for _, s := range h.gw.ScalingSignals() {
		got[s.Model+"/"+s.Role] = s
	}
	must.MapLen(t, 3, got)
	cases := []struct {
		key      string
		workers  int
		inFlight int64
		ttft     float64
		median   float64
		kv       float64
		hasKV    bool
		rate     float64 // median learned prefill rate
	}{
		{key: "agg/both", workers: 2, inFlight: 3, ttft: 1, median: 0, rate: worker.DefaultPrefillRate}, // nearest rank: the lower of two
		{key: "pd/prefill", workers: 1, rate: 20480},
		{key: "pd/decode", workers: 2, kv: 0.4, hasKV: true, rate: worker.DefaultPrefillRate},
	}
	for _, tc := range cases {
		t.Run(tc.key, func(t *testing.T) {
			s, ok := got[tc.key]
			must.True(t, ok)
			must.Eq(t, tc.workers, s.Workers)
			must.Eq(t, tc.inFlight, s.InFlight)
			must.InDelta(t, tc.ttft, s.TTFTP90, 1e-6)
			must.InDelta(t, tc.median, s.TTFTP50, 1e-6)
			must.Eq(t, tc.hasKV, s.HasKV)
			must.InDelta(t, tc.kv, s.KVUsage, 1e-9)
			must.Eq(t, 0, s.QueueWait) // uncapped admission never waits
			must.InDelta(t, tc.rate, s.PrefillRate, 1e-6)
		})
	}
}

// TestScalingCountsArrivalsAndPrefillTokens: every request for a model the router has served
// counts as an arrival (a model it never served is the client's text, not a label), and the
// prefill tokens the router sends an engine count under its role.
func TestScalingCountsArrivalsAndPrefillTokens(t *testing.T) {
	var hits atomic.Int64
	e := echoEngine(t, "a", &hits)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	for range 3 {
		resp := h.post("/v1/completions", `{"model":"m","prompt":"x"}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		must.Eq(t, 200, resp.StatusCode)
	}
	resp := h.post("/v1/completions", `{"model":"none","prompt":"x"}`)
	resp.Body.Close()
	must.Eq(t, 3.0, promtest.ToFloat64(h.m.Scaling.Arrivals.WithLabelValues("m")))
	must.Eq(t, 1, promtest.CollectAndCount(h.m.Scaling.Arrivals))
	// Its engines gone, the model's requests still count: they are what brings one back.
	h.pool.Set(nil)
	resp = h.post("/v1/completions", `{"model":"m","prompt":"x"}`)
	resp.Body.Close()
	must.Eq(t, 4.0, promtest.ToFloat64(h.m.Scaling.Arrivals.WithLabelValues("m")))

	h.setEngines(map[string]string{"a": "m@" + addr(e)})
	w := h.pool.All()[0]
	p := h.gw.beginPrefill("m", w, 700)
	must.Eq(t, 700.0, promtest.ToFloat64(h.m.Scaling.PrefillTokens.WithLabelValues("m", "both")))
	must.Eq(t, int64(700), w.Signals().PendingPrefillTokens)
	p.Cancel()
}

func TestPercentileNearestRank(t *testing.T) {
	cases := []struct {
		xs   []float64
		want float64
	}{
		{nil, 0},
		{[]float64{3}, 3},
		{[]float64{5, 1}, 5},
		{[]float64{10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 9},
		{[]float64{11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1}, 10},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, percentile(tc.xs, 0.9))
	}
	must.Eq(t, 2, percentile([]float64{3, 1, 2}, 0.5))
}
