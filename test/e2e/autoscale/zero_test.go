package autoscale

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/common/expfmt"
	prommodel "github.com/prometheus/common/model"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/localstack"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// Scale to zero (recipes/tiny/sim/agg-zero): the group runs no engine; a request for its model
// is held by the router (policy scale_to_zero) while the Nomad Autoscaler, on the router's
// held-requests gauge in Prometheus, starts one; the request is then served; after the idle
// window the autoscaler takes the group back to zero, and the next request starts one again.

const (
	zeroModel = "tiny-sim-zero"
	zeroJob   = "tiny-sim-zero"
	zeroHold  = 3 * time.Minute // the router's scale_to_zero.hold: far past the cold start here
	zeroIdle  = 30              // seconds without a request before the engine is removed
)

func TestScaleFromZeroHoldsThenServesAndIdleScalesToZero(t *testing.T) {
	if _, err := testbed.AutoscalerBinary(); err != nil {
		testutil.SkipUnlessCI(t, err.Error())
	}
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	home := filepath.Join(t.TempDir(), "oasis-home")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	// The demo recipe runs beside it, one engine, its own scaling off: this test is about the
	// agg-zero group only.
	s, err := localstack.Up(ctx, root, home, testWriter{t}, localstack.Options{Autoscale: true,
		DemoVariables: map[string]string{"count": "1", "scaling_enabled": "false"}})
	t.Cleanup(func() {
		if err := localstack.Down(home, io.Discard); err != nil {
			t.Errorf("down: %v", err)
		}
	})
	must.NoError(t, err)
	routers, err := s.WaitServicePassing(ctx, "oasis-router", 1)
	must.NoError(t, err)
	router := fmt.Sprintf("http://%s:%d", routers[0].Service.Address, routers[0].Service.Port)

	scaleToZeroPolicy(t, s, router)
	job, err := s.ParseJobFile(filepath.Join(root, "recipes/tiny/sim/agg-zero/job.nomad.hcl"), map[string]string{
		"region": s.Region, "datacenters": `["*"]`, "idle_seconds": fmt.Sprint(zeroIdle), "wake_cooldown": "20s"})
	must.NoError(t, err)
	_, _, err = s.Nomad.Jobs().Register(job, nil)
	must.NoError(t, err)
	must.Eq(t, 0, zeroGroupCount(t, s))
	must.Eq(t, 0, zeroEngines(t, s))

	// A streamed chat arrives with no engine: held, then served once the autoscaler started one.
	sent := time.Now()
	first := make(chan result, 1)
	go func() { first <- zeroChat(ctx, router) }()
	eventually(t, 30*time.Second, "the request held at the router", func() bool {
		// A cold start quicker than the poll ends the hold unseen: the served hold counted below
		// says it was held all the same.
		return routerMetric(t, router, "oasis_router_scaling_held_requests", zeroModel) == 1 || len(first) > 0
	})
	r := <-first
	must.NoError(t, r.err, must.Sprint("the held request must be served"))
	scaled := scaleEventAfter(t, s, sent)
	t.Logf("cold start: time to first token %s from the request (held; the autoscaler changed the count %s after it: "+
		"a Prometheus scrape plus an evaluation; the rest is placement, engine start, its health check and the request)",
		r.ttft.Round(10*time.Millisecond), scaled.Round(10*time.Millisecond))
	must.Eq(t, 1.0, routerMetric(t, router, "oasis_router_scaling_cold_start_holds_total", zeroModel, "served"))

	// With the engine up, requests are served without a hold.
	warm := zeroChat(ctx, router)
	must.NoError(t, warm.err)
	t.Logf("warm: time to first token %s", warm.ttft.Round(time.Millisecond))
	must.Eq(t, 1.0, routerMetric(t, router, "oasis_router_scaling_cold_start_holds_total", zeroModel, "served"))

	// Idle: back to zero, the engine drained and gone.
	idle := time.Now()
	eventually(t, 4*time.Minute, "the group back to 0", func() bool { return zeroGroupCount(t, s) == 0 })
	eventually(t, 2*time.Minute, "no engine of the model passing", func() bool { return zeroEngines(t, s) == 0 })
	t.Logf("scaled to zero %s after the last request (idle window %d s)", time.Since(idle).Round(time.Second), zeroIdle)

	// From zero again: the next request is held and served the same way.
	again := zeroChat(ctx, router)
	must.NoError(t, again.err, must.Sprint("a request after the scale-in must be held and served"))
	t.Logf("second cold start: time to first token %s", again.ttft.Round(10*time.Millisecond))
	must.Eq(t, 2.0, routerMetric(t, router, "oasis_router_scaling_cold_start_holds_total", zeroModel, "served"))
	for _, f := range []string{"timeout", "full", "cancelled"} {
		must.Zero(t, routerMetric(t, router, "oasis_router_scaling_cold_start_holds_total", zeroModel, f), must.Sprint(f))
	}
}

// zeroChat sends one streamed chat for the model and reads it to its end.
func zeroChat(ctx context.Context, router string) result {
	return streamChat(ctx, router, zeroModel, "Hello after a cold start", 16)
}

// streamChat sends one streamed chat to base (a router or an engine) and reads it to its end
// (readStream): ttft is from the request's start.
func streamChat(ctx context.Context, base, model, content string, maxTokens int) result {
	r := result{start: time.Now()}
	body, _ := json.Marshal(map[string]any{"model": model, "stream": true, "max_tokens": maxTokens,
		"messages": []map[string]string{{"role": "user", "content": content}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		r.err = err
		return r
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		r.err = fmt.Errorf("HTTP %s: %s", resp.Status, b)
		return r
	}
	r.ttft, r.err = readStream(resp, r.start)
	return r
}

// scaleToZeroPolicy adds the model's scale_to_zero to the router's policy in Consul KV and waits
// until the router applied it.
func scaleToZeroPolicy(t *testing.T, s *testbed.Stack, router string) {
	t.Helper()
	const key = "oasis/router/policy"
	var pair *consulapi.KVPair
	eventually(t, time.Minute, "the router's policy in Consul KV", func() bool {
		p, _, err := s.Consul.KV().Get(key, nil)
		pair = p
		return err == nil && p != nil
	})
	var doc map[string]any
	must.NoError(t, json.Unmarshal(pair.Value, &doc), must.Sprintf("the policy is JSON: %s", pair.Value))
	models, _ := doc["models"].(map[string]any)
	if models == nil {
		models = map[string]any{}
	}
	models[zeroModel] = map[string]any{"scale_to_zero": map[string]any{"hold": zeroHold.String(), "max_held": 16}}
	doc["models"] = models
	b, err := json.Marshal(doc)
	must.NoError(t, err)
	before := routerMetric(t, router, "oasis_router_policy_reloads_total")
	_, err = s.Consul.KV().Put(&consulapi.KVPair{Key: key, Value: b}, nil)
	must.NoError(t, err)
	eventually(t, time.Minute, "the router applying the scale-to-zero policy", func() bool {
		return routerMetric(t, router, "oasis_router_policy_reloads_total") > before
	})
}

// routerMetric reads one series of the router's /metrics: the family name and, in order, the
// values of its labels (model, then outcome); 0 when absent.
func routerMetric(t *testing.T, router, name string, labels ...string) float64 {
	t.Helper()
	resp, err := http.Get(router + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(prommodel.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	must.NoError(t, err)
	f, ok := fams[name]
	if !ok {
		return 0
	}
	for _, m := range f.GetMetric() {
		match := true
		for i, want := range labels {
			if i >= len(m.GetLabel()) || m.GetLabel()[i].GetValue() != want {
				match = false
			}
		}
		if !match {
			continue
		}
		switch {
		case m.GetGauge() != nil:
			return m.GetGauge().GetValue()
		case m.GetCounter() != nil:
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// scaleEventAfter is how long after t the autoscaler's first scaling event of the group came.
func scaleEventAfter(t *testing.T, s *testbed.Stack, after time.Time) time.Duration {
	t.Helper()
	st, _, err := s.Nomad.Jobs().ScaleStatus(zeroJob, nil)
	must.NoError(t, err)
	var first time.Time
	for _, e := range st.TaskGroups["engine"].Events {
		at := time.Unix(0, int64(e.Time))
		if at.After(after) && (first.IsZero() || at.Before(first)) {
			first = at
		}
	}
	must.False(t, first.IsZero(), must.Sprint("no scaling event after the request"))
	return first.Sub(after)
}

// zeroGroupCount is the agg-zero group's count in the job Nomad runs.
func zeroGroupCount(t *testing.T, s *testbed.Stack) int {
	t.Helper()
	j, _, err := s.Nomad.Jobs().Info(zeroJob, nil)
	must.NoError(t, err)
	must.SliceNotEmpty(t, j.TaskGroups)
	return *j.TaskGroups[0].Count
}

// zeroEngines is the model's engines passing their checks in Consul.
func zeroEngines(t *testing.T, s *testbed.Stack) int {
	t.Helper()
	es, _, err := s.Consul.Health().Service("oasis-engine", "", true, nil)
	must.NoError(t, err)
	n := 0
	for _, e := range es {
		if e.Service.Meta["oasis_model"] == zeroModel {
			n++
		}
	}
	return n
}
