package testbed

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// Prometheus is a Prometheus server scraping the stack with the shipped configuration,
// observability/prometheus.yml. Its process names the stack's directory, so Close of the stack
// (and `make down`) ends it too.
type Prometheus struct {
	// URL is the server's HTTP address: the web UI and the query API under /api/v1.
	URL string
	// Dir holds its configuration, log and data.
	Dir  string
	proc *process
}

// PrometheusConfig renders the shipped scrape configuration for this stack: every
// consul_sd_configs entry gets the stack's Consul address and, with ACLs on, token (a token
// holding observability/prometheus-consul-policy.hcl). Nothing else changes. It also returns the
// rule files the configuration names, relative to it.
func PrometheusConfig(shipped []byte, consulAddr, token string) (rendered []byte, ruleFiles []string, err error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(shipped, &cfg); err != nil {
		return nil, nil, fmt.Errorf("parsing the prometheus configuration: %w", err)
	}
	rules, _ := cfg["rule_files"].([]any)
	for _, r := range rules {
		if r, ok := r.(string); ok {
			ruleFiles = append(ruleFiles, r)
		}
	}
	jobs, _ := cfg["scrape_configs"].([]any)
	found := false
	for _, j := range jobs {
		job, _ := j.(map[string]any)
		sds, _ := job["consul_sd_configs"].([]any)
		for _, sd := range sds {
			sd, ok := sd.(map[string]any)
			if !ok {
				continue
			}
			found = true
			sd["server"] = consulAddr
			if token != "" {
				sd["token"] = token
			}
		}
	}
	if !found {
		return nil, nil, errors.New("the prometheus configuration has no consul_sd_configs")
	}
	rendered, err = yaml.Marshal(cfg)
	return rendered, ruleFiles, err
}

// StartPrometheus starts bin/prometheus (`make hashistack`; OASIS_PROMETHEUS_BIN overrides) on a
// free loopback port with the shipped configuration rendered for this stack, and waits until it
// is ready. With ACLs on it creates the Consul policy Prometheus's service discovery needs from
// observability/prometheus-consul-policy.hcl and a token holding it.
func (s *Stack) StartPrometheus(ctx context.Context) (*Prometheus, error) {
	bin, err := hashiBinary(s.root, "prometheus", "OASIS_PROMETHEUS_BIN")
	if err != nil {
		return nil, err
	}
	shipped, err := os.ReadFile(filepath.Join(s.root, "observability", "prometheus.yml"))
	if err != nil {
		return nil, err
	}
	var token string
	if s.ConsulToken != "" {
		rules, err := os.ReadFile(filepath.Join(s.root, "observability", "prometheus-consul-policy.hcl"))
		if err != nil {
			return nil, err
		}
		// Named per datacenter: a federation's policies are global, one Prometheus runs in each.
		if token, err = s.consulPolicyToken("prometheus-"+s.Datacenter, string(rules)); err != nil {
			return nil, err
		}
	}
	cfg, ruleFiles, err := PrometheusConfig(shipped, s.ConsulAddr, token)
	if err != nil {
		return nil, err
	}
	p := &Prometheus{Dir: filepath.Join(s.Dir, "prometheus")}
	if err := os.MkdirAll(p.Dir, 0o755); err != nil {
		return nil, err
	}
	// The rule files sit beside the configuration, as they do in observability/.
	for _, r := range ruleFiles {
		data, err := os.ReadFile(filepath.Join(s.root, "observability", r))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(p.Dir, r), data, 0o644); err != nil {
			return nil, err
		}
	}
	// The file holds a token: its owner's only.
	cfgPath := filepath.Join(p.Dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, cfg, 0o600); err != nil {
		return nil, err
	}
	ports, err := testutil.FreePorts(1)
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", ports[0])
	p.URL = "http://" + addr
	p.proc, err = startProcess(bin, []string{
		"--config.file=" + cfgPath,
		"--storage.tsdb.path=" + filepath.Join(p.Dir, "data"),
		"--storage.tsdb.retention.time=1d",
		"--web.listen-address=" + addr,
	}, filepath.Join(p.Dir, "prometheus.log"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = poll(ctx, 100*time.Millisecond, "prometheus ready", func() (bool, error) {
		if p.proc.exited() {
			return false, permanentError{errors.New("prometheus exited")}
		}
		resp, err := http.Get(p.URL + "/-/ready")
		if err != nil {
			return false, err
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%w\nprometheus log:\n%s", err, s.tail("prometheus/prometheus.log")), p.Close())
	}
	s.logf("testbed: prometheus ready at %s", p.URL)
	return p, nil
}

// Close stops the server (the stack's Close ends it as well).
func (p *Prometheus) Close() error { return stopProcess(p.proc, 10*time.Second) }

// PromSample is one series of an instant query's answer.
type PromSample struct {
	Metric map[string]string
	Value  float64 // NaN when Prometheus answered no number
}

// PromQuery evaluates expr now on the Prometheus at base (its URL).
func PromQuery(ctx context.Context, base, expr string) ([]PromSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/v1/query?query="+url.QueryEscape(expr), nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var res struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []struct {
				Metric map[string]string `json:"metric"`
				Value  [2]any            `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return nil, fmt.Errorf("query %s: %w", expr, err)
	}
	if res.Status != "success" {
		return nil, fmt.Errorf("query %s failed: %s", expr, res.Error)
	}
	out := make([]PromSample, 0, len(res.Data.Result))
	for _, r := range res.Data.Result {
		v := math.NaN()
		if s, ok := r.Value[1].(string); ok {
			if f, err := strconv.ParseFloat(s, 64); err == nil {
				v = f
			}
		}
		out = append(out, PromSample{Metric: r.Metric, Value: v})
	}
	return out, nil
}
