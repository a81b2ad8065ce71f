// Package observability runs the shipped Prometheus configuration against the local stack that
// `make up` starts (router and kvcached jobs, the simulator recipe, under ACLs), drives traffic
// through the router and kvcached, and evaluates every query of the shipped Grafana dashboard
// against that Prometheus: no panel may come back empty.
package observability

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/test/e2e/localstack"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

func TestEveryDashboardPanelHasData(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	home := filepath.Join(t.TempDir(), "oasis-home")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	s, err := localstack.Up(ctx, root, home, testWriter{t}, localstack.Options{})
	t.Cleanup(func() {
		if err := localstack.Down(home, io.Discard); err != nil {
			t.Errorf("down: %v", err)
		}
	})
	if err != nil && s != nil {
		t.Logf("nomad log:\n%s", s.NomadLog())
	}
	must.NoError(t, err)
	prom, err := localstack.PrometheusURL(home, "dc1")
	must.NoError(t, err)

	routers, err := s.WaitServicePassing(ctx, "oasis-router", 1)
	must.NoError(t, err)
	router := fmt.Sprintf("http://%s:%d", routers[0].Service.Address, routers[0].Service.Port)
	kvcached, err := s.WaitServicePassing(ctx, "oasis-kvcached", 1)
	must.NoError(t, err)
	_, err = s.WaitServicePassing(ctx, "oasis-engine", 3)
	must.NoError(t, err)

	// Every target Prometheus found through Consul is scraped: the token reads the catalog and
	// each job's relabelling reaches the metrics endpoint.
	waitTargetsUp(t, ctx, prom, []string{"oasis-router", "oasis-engine", "oasis-kvcached", "nomad"})

	// The shipped alerting rules are loaded and evaluate without error, and the series the GPU
	// alert reads exists (this node has no GPUs: zero of each health).
	rulesEvaluate(t, ctx, prom, filepath.Join(root, "observability", "alerts.yml"))
	n := waitSeries(t, ctx, prom, `oasis_router_node_gpus{health="unhealthy"}`, 60*time.Second, "node_gpus for the GPU alert")
	must.Positive(t, n)

	// Traffic for a few scrape intervals: streamed chats sharing a long system prompt through the
	// router, and writes and reads (hits and misses) against kvcached.
	password, err := localstack.KvcachedPassword(s)
	must.NoError(t, err)
	rdb := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("%s:%d", kvcached[0].Service.Address, kvcached[0].Service.Port),
		Password: password})
	defer rdb.Close()
	system := strings.Repeat("Oasis routes each request to the engine that already holds its prefix. ", 40)
	block := strings.Repeat("k", 64<<10)
	traffic := time.Now().Add(35 * time.Second)
	for i := 0; time.Now().Before(traffic); i++ {
		chat(t, ctx, router, system, fmt.Sprintf("Question number %d: what is cached?", i))
		key := "e2e-block-" + strconv.Itoa(i)
		must.NoError(t, rdb.Set(ctx, key, block, 0).Err())
		must.NoError(t, rdb.Get(ctx, key).Err())
		must.ErrorIs(t, rdb.Get(ctx, key+"-missing").Err(), redis.Nil)
	}

	for _, p := range dashboardQueries(t, filepath.Join(root, "observability", "grafana-dashboard.json")) {
		t.Run(p.panel+"/"+p.legend, func(t *testing.T) {
			for metric, why := range notOnOneNode {
				if strings.Contains(p.expr, metric) {
					t.Skipf("%s: %s", p.expr, why)
				}
			}
			n := waitSeries(t, ctx, prom, p.expr, 90*time.Second, fmt.Sprintf("panel %q", p.panel))
			t.Logf("%d series: %s", n, p.expr)
		})
	}
}

// notOnOneNode are the metrics (by prefix) of features the single-node stack does not run, so
// their panels are skipped, by name, rather than passing empty.
var notOnOneNode = map[string]string{
	"oasis_kvcached_peer_": "kvcached registers its peer metrics only with peers enabled (a second node and peer TLS or the mesh); kvcached/peer's tests cover them",
}

// panelQuery is one target of a dashboard panel, with Grafana's variables substituted.
type panelQuery struct{ panel, legend, expr string }

// dashboardQueries reads every target of every panel, substituting Grafana's template
// variables: a query variable's "All" value (its allValue, as the dashboard's default), and
// $__rate_interval / $__interval as Grafana would for this Prometheus's 10 s scrape interval.
func dashboardQueries(t *testing.T, path string) []panelQuery {
	t.Helper()
	data, err := os.ReadFile(path)
	must.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr         string `json:"expr"`
				LegendFormat string `json:"legendFormat"`
				RefID        string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name     string `json:"name"`
				Type     string `json:"type"`
				AllValue string `json:"allValue"`
			} `json:"list"`
		} `json:"templating"`
	}
	must.NoError(t, json.Unmarshal(data, &dash))
	var vars []string
	for _, v := range dash.Templating.List {
		if v.Type == "query" {
			all := v.AllValue
			if all == "" {
				all = ".*"
			}
			vars = append(vars, "${"+v.Name+"}", all, "$"+v.Name, all)
		}
	}
	// Grafana's $__rate_interval is at least four scrape intervals.
	vars = append(vars, "$__rate_interval", "1m", "${__rate_interval}", "1m", "$__interval", "10s", "$__range", "1h")
	subst := strings.NewReplacer(vars...)
	var out []panelQuery
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			if target.Expr == "" {
				continue
			}
			legend := target.LegendFormat
			if legend == "" {
				legend = target.RefID
			}
			out = append(out, panelQuery{panel: p.Title, legend: legend, expr: subst.Replace(target.Expr)})
		}
	}
	must.Greater(t, 10, len(out), must.Sprint("the dashboard has too few queries"))
	return out
}

// waitSeries evaluates expr until it returns at least one series with a number (not NaN: a
// panel that draws nothing), failing the test with what and the last answer after timeout, and
// returns how many such series it had.
func waitSeries(t *testing.T, ctx context.Context, prom, expr string, timeout time.Duration, what string) int {
	t.Helper()
	n := 0
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		res, err := testbed.PromQuery(ctx, prom, expr)
		if err != nil {
			return fmt.Errorf("%s: %s: %w", what, expr, err)
		}
		n = 0
		for _, r := range res {
			if !math.IsNaN(r.Value) {
				n++
			}
		}
		if n == 0 {
			return fmt.Errorf("%s: %s: %d series, none with a number", what, expr, len(res))
		}
		return nil
	}), wait.Timeout(timeout), wait.Gap(2*time.Second)))
	return n
}

// waitTargetsUp waits until Prometheus has at least one active target of each job and all of
// them are up.
func waitTargetsUp(t *testing.T, ctx context.Context, prom string, jobs []string) {
	t.Helper()
	var up map[string]int
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		var res struct {
			Data struct {
				ActiveTargets []struct {
					Labels    map[string]string `json:"labels"`
					Health    string            `json:"health"`
					LastError string            `json:"lastError"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := getJSON(ctx, prom+"/api/v1/targets?state=active", &res); err != nil {
			return fmt.Errorf("prometheus targets: %w", err)
		}
		up = map[string]int{}
		down := []string{}
		for _, tg := range res.Data.ActiveTargets {
			if tg.Health == "up" {
				up[tg.Labels["job"]]++
			} else {
				down = append(down, fmt.Sprintf("%s %s: %s %s", tg.Labels["job"], tg.Labels["instance"], tg.Health, tg.LastError))
			}
		}
		missing := []string{}
		for _, j := range jobs {
			if up[j] == 0 {
				missing = append(missing, j)
			}
		}
		if len(missing) > 0 || len(down) > 0 {
			return fmt.Errorf("prometheus targets: no target up for %v; not up: %v", missing, down)
		}
		return nil
	}), wait.Timeout(90*time.Second), wait.Gap(time.Second)))
	t.Logf("prometheus targets up: %v", up)
}

// rulesEvaluate waits until Prometheus has loaded every rule of the rule file and evaluated each
// without error.
func rulesEvaluate(t *testing.T, ctx context.Context, prom, file string) {
	t.Helper()
	data, err := os.ReadFile(file)
	must.NoError(t, err)
	want := strings.Count(string(data), "- alert:")
	ok := 0
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		var res struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name      string `json:"name"`
						Health    string `json:"health"`
						LastError string `json:"lastError"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := getJSON(ctx, prom+"/api/v1/rules?type=alert", &res); err != nil {
			return fmt.Errorf("prometheus rules: %w", err)
		}
		ok = 0
		bad := []string{}
		for _, g := range res.Data.Groups {
			for _, r := range g.Rules {
				if r.Health == "ok" {
					ok++
				} else {
					bad = append(bad, fmt.Sprintf("%s: %s %s", r.Name, r.Health, r.LastError))
				}
			}
		}
		if ok != want {
			return fmt.Errorf("prometheus evaluates %d of %d alerting rules; not ok: %v", ok, want, bad)
		}
		return nil
	}), wait.Timeout(60*time.Second), wait.Gap(time.Second)))
	t.Logf("prometheus evaluates %d alerting rules", ok)
}

func getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(v)
}

// chat sends one streamed chat completion through the router and reads it to the end.
func chat(t *testing.T, ctx context.Context, router, system, user string) {
	t.Helper()
	body, err := json.Marshal(map[string]any{
		"model": "tiny-sim", "stream": true, "max_tokens": 8,
		"stream_options": map[string]any{"include_usage": true},
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
	})
	must.NoError(t, err)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, router+"/v1/chat/completions", strings.NewReader(string(body)))
	must.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	must.EqOp(t, http.StatusOK, resp.StatusCode, must.Sprintf("chat completion: %s", b))
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
