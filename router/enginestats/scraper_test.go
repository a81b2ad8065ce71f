package enginestats

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
)

func TestScraperEngineAndPower(t *testing.T) {
	var gen atomic.Int64
	var fail atomic.Bool
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if fail.Load() || r.URL.Path != "/metrics" {
			http.Error(w, "down", 500)
			return
		}
		fmt.Fprintf(w, "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\nvllm:kv_cache_usage_perc 0.4\n"+
			"vllm:generation_tokens_total %d\noasis_sim_power_watts 200\n", gen.Load())
	}))
	defer e.Close()
	pool := discovery.New(discovery.Config{})
	pool.Set([]discovery.Instance{{ID: "w", Address: strings.TrimPrefix(e.URL, "http://"), Meta: map[string]string{discovery.MetaModel: "m"}}})
	s, err := NewScraper(ScraperConfig{Pool: pool, HTTP: e.Client()})
	must.NoError(t, err)
	w := pool.Workers("m")[0]

	s.scrapeAll(context.Background(), time.Second)
	sig := w.Signals()
	must.True(t, sig.EngineMetrics)
	must.Eq(t, 2.0, sig.Running)
	must.Eq(t, 1.0, sig.Waiting)
	must.Eq(t, 0.4, sig.KVUsage)
	must.False(t, sig.HasPower) // needs two samples for a rate

	// 400 tokens in ~0.1 s at 200 W ≈ 20 tokens/J.
	gen.Store(400)
	time.Sleep(100 * time.Millisecond) // the input: the interval the rate is over
	s.scrapeAll(context.Background(), time.Second)
	sig = w.Signals()
	must.True(t, sig.HasPower)
	must.Eq(t, 200.0, sig.PowerWatts)
	must.Between(t, 5, sig.TokensPerJoule, 21)
	first := sig.TokensPerJoule
	// Two sequences ran at both ends of the interval: each one's share.
	must.Eq(t, first/2, sig.SeqTokensPerJoule)

	// Idle: efficiency is kept, not dropped to zero.
	time.Sleep(20 * time.Millisecond) // the input: an idle interval
	s.scrapeAll(context.Background(), time.Second)
	sig = w.Signals()
	must.Eq(t, first, sig.TokensPerJoule)
	must.Eq(t, first/2, sig.SeqTokensPerJoule)
	must.Eq(t, 0.0, sig.GenTokensPerSec)

	// A failed scrape makes engine metrics unknown.
	fail.Store(true)
	s.scrapeAll(context.Background(), time.Second)
	must.False(t, w.Signals().EngineMetrics)
}

func TestScraperNodePowerSplit(t *testing.T) {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "vllm:num_requests_running 0\n")
	}))
	defer e.Close()
	addr := strings.TrimPrefix(e.URL, "http://")
	pool := discovery.New(discovery.Config{})
	pool.Set([]discovery.Instance{
		{ID: "a", Address: addr, Meta: map[string]string{discovery.MetaModel: "m", discovery.MetaNode: "n1"}},
		{ID: "b", Address: addr, Meta: map[string]string{discovery.MetaModel: "m", discovery.MetaNode: "n1"}},
	})
	s, err := NewScraper(ScraperConfig{Pool: pool, HTTP: e.Client()})
	must.NoError(t, err)
	s.nodeW["n1"] = 600
	s.scrapeAll(context.Background(), time.Second)
	// Router-counted tokens stand in for an engine without a token counter.
	for _, w := range pool.Workers("m") {
		w.Live.AddGenerated(300)
	}
	time.Sleep(50 * time.Millisecond) // the input: the interval the rate is over
	s.scrapeAll(context.Background(), time.Second)
	for _, w := range pool.Workers("m") {
		sig := w.Signals()
		must.True(t, sig.HasPower)
		must.Eq(t, 300.0, sig.PowerWatts) // 600 W shared by two engines
		must.Greater(t, 0.0, sig.TokensPerJoule)
		// No engine running count: the router's in-flight (none) counts as one.
		must.Eq(t, sig.TokensPerJoule, sig.SeqTokensPerJoule)
	}
}

// TestPollNodesCountsReads: a Nomad answering 403 (a token without node
// read) counts errors and leaves the node's power unknown; once it answers,
// reads count ok and the node's GPU power is known.
func TestPollNodesCountsReads(t *testing.T) {
	var denied atomic.Bool
	denied.Store(true)
	nomad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/client/stats" || r.URL.Query().Get("node_id") != "n1" {
			http.NotFound(w, r)
			return
		}
		if denied.Load() {
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		fmt.Fprint(w, `{"DeviceStats":[{"Vendor":"nvidia","Type":"gpu","Name":"A100","InstanceStats":{"GPU-0":{"Stats":{"Attributes":{"Power draw":{"FloatNumeratorVal":250,"Unit":"W"}}}}}}]}`)
	}))
	defer nomad.Close()
	nc, err := nomadapi.NewClient(&nomadapi.Config{Address: nomad.URL})
	must.NoError(t, err)
	pool := discovery.New(discovery.Config{})
	pool.Set([]discovery.Instance{{ID: "a", Address: "127.0.0.1:1", Meta: map[string]string{discovery.MetaModel: "m", discovery.MetaNode: "n1"}}})
	reg := prometheus.NewRegistry()
	s, err := NewScraper(ScraperConfig{Pool: pool, Nomad: nc, Metrics: metrics.New(reg)})
	must.NoError(t, err)

	s.pollNodes(context.Background())
	s.pollNodes(context.Background())
	must.Eq(t, 2.0, testutil.ToFloat64(s.m.NodeStatsReads.WithLabelValues("error")))
	must.MapEmpty(t, s.nodeW)

	denied.Store(false)
	s.pollNodes(context.Background())
	must.Eq(t, 1.0, testutil.ToFloat64(s.m.NodeStatsReads.WithLabelValues("ok")))
	must.Eq(t, map[string]float64{"n1": 250}, s.nodeW)
}
