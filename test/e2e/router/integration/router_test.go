package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/enginestats"
	"github.com/oasis-llm/oasis/router/gateway"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// router is an in-process oasis-router wired like cmd/oasis-router, against
// the shared Consul agent, isolated per test by a service tag and KV prefix.
type router struct {
	pool    *discovery.Pool
	m       *metrics.Metrics
	watcher *policy.Watcher
	url     string
	tag     string
	key     string
}

func newRouter(t *testing.T, client *consulapi.Client) *router {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	reg := prometheus.NewRegistry()
	r := &router{pool: discovery.New(discovery.Config{}), m: metrics.New(reg), tag: "it-" + sanitize(t.Name()),
		key: "oasis-it/" + sanitize(t.Name()) + "/policy"}
	log := hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Warn, Output: testWriter{t}})
	// The terms cmd/oasis-router registers (the default policy weights ttft); with no cache
	// state or tokenizer behind them prefix and ttft are neutral, which these tests (about
	// discovery, policy and proxying) rely on.
	terms, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.CacheTerms(nil)...)...)
	must.NoError(t, err)
	src := &discovery.Consul{Client: client, Tag: r.tag, Logger: log, Metrics: r.m}
	r.watcher, err = policy.NewWatcher(policy.WatcherConfig{Client: client, Key: r.key, Terms: terms, Metrics: r.m, Logger: log})
	must.NoError(t, err)
	tr := gateway.NewEngineTransport(gateway.EngineTransportConfig{DialTimeout: time.Second})
	sc, err := enginestats.NewScraper(enginestats.ScraperConfig{Pool: r.pool, HTTP: &http.Client{Transport: tr}, Interval: 200 * time.Millisecond, Logger: log, Metrics: r.m})
	must.NoError(t, err)
	var wg sync.WaitGroup
	for _, f := range []func(){func() { src.Run(ctx, r.pool) }, func() { r.watcher.Run(ctx) }, func() { sc.Run(ctx) }} {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	gw, err := gateway.New(gateway.Config{Pool: r.pool, Policy: r.watcher, Selector: scoring.NewSelector(scoring.SelectorConfig{Registry: terms}),
		Admission: admission.New(), Metrics: r.m, Gatherer: reg, Logger: log, Transport: tr})
	must.NoError(t, err)
	srv := httptest.NewServer(gw)
	r.url = srv.URL
	t.Cleanup(func() {
		srv.Close()
		cancel()
		wg.Wait()
		_, _ = client.KV().DeleteTree("oasis-it/"+sanitize(t.Name()), nil)
	})
	return r
}

func sanitize(s string) string { return strings.NewReplacer("/", "-", " ", "-").Replace(s) }

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// registerTagged registers a sim with the router's isolation tag.
func (r *router) register(t *testing.T, c *consulapi.Client, id, model string, s *sim) {
	register(t, c, id, model, s)
	svc, _, err := c.Agent().Service(id, nil)
	must.NoError(t, err)
	reg := &consulapi.AgentServiceRegistration{ID: id, Name: svc.Service, Address: svc.Address, Port: svc.Port,
		Tags: append(svc.Tags, r.tag), Meta: svc.Meta,
		Check: &consulapi.AgentServiceCheck{CheckID: "ttl-" + id, TTL: "10m", Status: consulapi.HealthPassing}}
	must.NoError(t, c.Agent().ServiceRegister(reg))
}

func (r *router) ids(model string) []string {
	var out []string
	for _, w := range r.pool.Workers(model) {
		out = append(out, w.ID)
	}
	return out
}

// waitPool waits until model's pool is exactly ids and returns how long it took.
func (r *router) waitPool(t *testing.T, model string, ids ...string) time.Duration {
	t.Helper()
	start := time.Now()
	// ErrorFunc: a failure shows the pool as it was at the end, not the start.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if have := r.ids(model); strings.Join(have, ",") != strings.Join(ids, ",") {
			return fmt.Errorf("pool of %s: have %v, want %v", model, have, ids)
		}
		return nil
	}), wait.Timeout(10*time.Second), wait.Gap(2*time.Millisecond)))
	return time.Since(start)
}

func chat(t *testing.T, url, model string, stream bool) (int, string) {
	t.Helper()
	opts := ""
	if stream {
		opts = `,"stream_options":{"include_usage":true}`
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":4,"stream":%v%s}`, model, stream, opts)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return resp.StatusCode, string(b)
}

func TestDiscoveryJoinFailMaintenance(t *testing.T) {
	c := consul.client
	r := newRouter(t, c)
	s1, s2, s3 := startSim(t, "alpha"), startSim(t, "alpha"), startSim(t, "beta")
	r.register(t, c, "e1", "alpha", s1)
	r.register(t, c, "e2", "alpha", s2)
	r.register(t, c, "e3", "beta", s3)
	r.waitPool(t, "alpha", "e1", "e2")
	r.waitPool(t, "beta", "e3")
	w := r.pool.Workers("alpha")[0]
	must.Eq(t, "sim", w.Engine)
	must.Eq(t, 16, w.BlockSize)
	must.Eq(t, "node-e1", w.Node)
	must.Eq(t, s1.Addr, w.Address)

	code, _ := chat(t, r.url, "beta", false)
	must.Eq(t, 200, code)

	// A failing check takes the instance out.
	must.NoError(t, c.Agent().FailTTL("ttl-e1", "engine unhealthy"))
	took := r.waitPool(t, "alpha", "e2")
	t.Logf("failed check → left pool after %v", took)
	must.NoError(t, c.Agent().PassTTL("ttl-e1", ""))
	r.waitPool(t, "alpha", "e1", "e2")

	// Maintenance mode takes it out, and back.
	must.NoError(t, c.Agent().EnableServiceMaintenance("e2", "draining"))
	took = r.waitPool(t, "alpha", "e1")
	t.Logf("maintenance → left pool after %v", took)
	must.NoError(t, c.Agent().DisableServiceMaintenance("e2"))
	r.waitPool(t, "alpha", "e1", "e2")

	// The last instance of a model leaving gives 503, not 404.
	must.NoError(t, c.Agent().FailTTL("ttl-e3", "down"))
	r.waitPool(t, "beta")
	code, body := chat(t, r.url, "beta", false)
	must.Eq(t, 503, code)
	must.StrContains(t, body, "no_healthy_worker")
	code, _ = chat(t, r.url, "gamma", false)
	must.Eq(t, 404, code)
	must.Eq(t, 0.0, promtest.ToFloat64(r.m.DiscoveryStale))
}

func TestConsulUnreachableKeepsPool(t *testing.T) {
	// A Consul of its own, so it can be stopped.
	own, err := startConsul(t.TempDir())
	must.NoError(t, err)
	defer own.stop()
	r := newRouter(t, own.client)
	s := startSim(t, "alpha")
	r.register(t, own.client, "e1", "alpha", s)
	r.waitPool(t, "alpha", "e1")
	own.stop()
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, "the discovery stale gauge to read 1", func() bool { return promtest.ToFloat64(r.m.DiscoveryStale) == 1 })
	must.Eq(t, []string{"e1"}, r.ids("alpha"))
	code, _ := chat(t, r.url, "alpha", true)
	must.Eq(t, 200, code)
	must.Greater(t, 0.0, promtest.ToFloat64(r.m.DiscoveryErrors))
}

func TestPolicyDocument(t *testing.T) {
	c := consul.client
	r := newRouter(t, c)
	// Absent: the router writes the default, and applies it.
	testutil.Eventually(t, 10*time.Second, "the watcher to apply the default policy it wrote", func() bool { return r.watcher.AppliedIndex() != 0 })
	pair, _, err := c.KV().Get(r.key, nil)
	must.NoError(t, err)
	must.NotNil(t, pair)
	must.StrContains(t, string(pair.Value), `"weighted"`)
	must.Eq(t, scoring.Weighted, r.watcher.Current().Policy)

	put := func(doc string) uint64 {
		_, err := c.KV().Put(&consulapi.KVPair{Key: r.key, Value: []byte(doc)}, nil)
		must.NoError(t, err)
		p, _, err := c.KV().Get(r.key, nil)
		must.NoError(t, err)
		return p.ModifyIndex
	}
	reloads := promtest.ToFloat64(r.m.PolicyReloads)
	idx := put(`{"policy":"least_load","models":{"alpha":{"policy":"round_robin","admission":{"max_in_flight":4}}}}`)
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "the watcher to apply the new policy", func() bool { return r.watcher.AppliedIndex() == idx })
	must.Eq(t, scoring.LeastLoad, r.watcher.Current().For("x").Scoring.Policy)
	must.Eq(t, scoring.RoundRobin, r.watcher.Current().For("alpha").Scoring.Policy)
	must.Eq(t, 4, r.watcher.Current().For("alpha").Limits.MaxInFlight)
	must.Eq(t, reloads+1, promtest.ToFloat64(r.m.PolicyReloads))

	// Invalid documents are rejected, counted, and change nothing.
	good := r.watcher.Current()
	for i, bad := range []string{`{"policy":"weighted","weights":{"nope":1}}`, `not json`, `{"policy":"least_load","typo":1}`} {
		put(bad)
		testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, fmt.Sprintf("policy rejection %d to be counted", i+1), func() bool { return promtest.ToFloat64(r.m.PolicyRejects) == float64(i+1) })
		must.True(t, good == r.watcher.Current(), must.Sprint("the last good document stays"))
	}
	must.Eq(t, idx, r.watcher.AppliedIndex())
}

func TestPolicyNeverOverwritten(t *testing.T) {
	c := consul.client
	key := "oasis-it/" + sanitize(t.Name()) + "/policy"
	// An operator's document exists before the router starts: the default
	// write (CAS on index 0) must not replace it.
	_, err := c.KV().Put(&consulapi.KVPair{Key: key, Value: []byte(`{"policy":"round_robin"}`)}, nil)
	must.NoError(t, err)
	r := newRouter(t, c)
	testutil.Eventually(t, 10*time.Second, "the watcher to apply the existing policy", func() bool { return r.watcher.AppliedIndex() != 0 })
	must.Eq(t, scoring.RoundRobin, r.watcher.Current().Policy)
	pair, _, err := c.KV().Get(key, nil)
	must.NoError(t, err)
	must.Eq(t, `{"policy":"round_robin"}`, string(pair.Value))
}

func TestRoutingAcrossSims(t *testing.T) {
	c := consul.client
	r := newRouter(t, c)
	sims := []*sim{startSim(t, "alpha"), startSim(t, "alpha"), startSim(t, "alpha")}
	for i, s := range sims {
		r.register(t, c, fmt.Sprintf("e%d", i), "alpha", s)
	}
	r.waitPool(t, "alpha", "e0", "e1", "e2")
	_, err := c.KV().Put(&consulapi.KVPair{Key: r.key, Value: []byte(`{"policy":"round_robin"}`)}, nil)
	must.NoError(t, err)
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "the round_robin policy to apply", func() bool { return r.watcher.Current().Policy == scoring.RoundRobin })

	served := func(id string) float64 { return promtest.ToFloat64(r.m.Requests.WithLabelValues("alpha", "200", id)) }
	for range 30 {
		code, body := chat(t, r.url, "alpha", true)
		must.Eq(t, 200, code)
		must.StrContains(t, body, "data: [DONE]")
	}
	// Counted as each handler ends, which may trail the client's last read.
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "10 requests served by each engine", func() bool {
		return served("e0") == 10 && served("e1") == 10 && served("e2") == 10
	})
	// Usage came from the engines' final events.
	must.Eq(t, 30*4.0, promtest.ToFloat64(r.m.Tokens.WithLabelValues("alpha", "e0", "completion"))+
		promtest.ToFloat64(r.m.Tokens.WithLabelValues("alpha", "e1", "completion"))+promtest.ToFloat64(r.m.Tokens.WithLabelValues("alpha", "e2", "completion")))

	// The scraper sees the sims' load and power gauges.
	testutil.EventuallyEvery(t, 5*time.Second, 20*time.Millisecond, "the scraper to read the sim's load and power gauges", func() bool {
		s := r.pool.Workers("alpha")[0].Signals()
		return s.EngineMetrics && s.HasPower && s.PowerWatts > 0
	})

	// A sim that dies without its check failing yet costs no request: connect
	// failures before the first byte are retried on another worker.
	_ = sims[1].Kill()
	for range 12 {
		code, _ := chat(t, r.url, "alpha", true)
		must.Eq(t, 200, code)
	}
	must.Greater(t, 0.0, promtest.ToFloat64(r.m.Retries.WithLabelValues("alpha")))
}

func TestStreamingThroughRouterIsIncremental(t *testing.T) {
	c := consul.client
	r := newRouter(t, c)
	// Real-time simulated decode: tokens arrive spread over time.
	s := startSim(t, "alpha", "--speed", "1", "--step-time-base", "20ms")
	r.register(t, c, "e0", "alpha", s)
	r.waitPool(t, "alpha", "e0")
	body := `{"model":"alpha","messages":[{"role":"user","content":"hi"}],"max_tokens":10,"stream":true}`
	resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	var arrivals []time.Time
	for {
		line, err := br.ReadString('\n')
		if strings.HasPrefix(line, "data: {") {
			arrivals = append(arrivals, time.Now())
			var ev map[string]any
			must.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &ev))
		}
		if err != nil {
			break
		}
	}
	must.Greater(t, 5, len(arrivals))
	// Events arrive spread over the decode, not in one burst at the end.
	spread := arrivals[len(arrivals)-1].Sub(arrivals[0])
	must.Greater(t, 100*time.Millisecond, spread)
}

// TestPowerAwareRouting: two oasis-sim engines with different power models
// serve the same load; once the scraper has their tokens-per-joule, a
// power-weighted policy sends the traffic to the efficient one.
func TestPowerAwareRouting(t *testing.T) {
	c := consul.client
	r := newRouter(t, c)
	frugal := startSim(t, "alpha", "--power-idle-watts", "40", "--power-watts-per-util", "100")
	hungry := startSim(t, "alpha", "--power-idle-watts", "300", "--power-watts-per-util", "400")
	r.register(t, c, "frugal", "alpha", frugal)
	r.register(t, c, "hungry", "alpha", hungry)
	r.waitPool(t, "alpha", "frugal", "hungry")
	_, err := c.KV().Put(&consulapi.KVPair{Key: r.key, Value: []byte(`{"policy":"round_robin"}`)}, nil)
	must.NoError(t, err)
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "the round_robin policy to apply", func() bool { return r.watcher.Current().Policy == scoring.RoundRobin })

	// Warm up under round robin until both engines have an efficiency estimate.
	measured := func() bool {
		for _, w := range r.pool.Workers("alpha") {
			if s := w.Signals(); !s.HasPower || s.TokensPerJoule <= 0 {
				return false
			}
		}
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := `{"model":"alpha","messages":[{"role":"user","content":"hello"}],"max_tokens":8,"stream":true}`
			for ctx.Err() == nil && !measured() {
				resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					continue
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	must.True(t, measured(), must.Sprint("both engines got a tokens-per-joule estimate"))
	var eff = map[string]float64{}
	for _, w := range r.pool.Workers("alpha") {
		eff[w.ID] = w.Signals().TokensPerJoule
	}
	t.Logf("tokens per joule: %v", eff)
	must.Greater(t, eff["hungry"], eff["frugal"])

	_, err = c.KV().Put(&consulapi.KVPair{Key: r.key, Value: []byte(`{"policy":"weighted","weights":{"power":1}}`)}, nil)
	must.NoError(t, err)
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "the weighted power policy to apply", func() bool { return r.watcher.Current().Policy == scoring.Weighted })
	before := promtest.ToFloat64(r.m.Requests.WithLabelValues("alpha", "200", "frugal"))
	for range 20 {
		code, _ := chat(t, r.url, "alpha", true)
		must.Eq(t, 200, code)
	}
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "at least 18 of 20 requests served by frugal", func() bool {
		return promtest.ToFloat64(r.m.Requests.WithLabelValues("alpha", "200", "frugal"))-before >= 18
	})
}
