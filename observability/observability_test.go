// Package observability holds the Grafana dashboard, the Prometheus scrape configuration and the
// alerting rules; its tests keep them true to the metrics Oasis exports and the service meta its
// jobs register.
package observability

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
	"go.yaml.in/yaml/v3"
)

var metricName = regexp.MustCompile(`\b(oasis_[a-z_]+|vllm:[a-z_]+)`)

// goSources concatenates the non-test Go sources of the repository, where metric names live.
func goSources(t *testing.T) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "tools" || d.Name() == "bench" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(path, ".go") && !strings.HasSuffix(path, "_test.go") {
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			files[path] = string(data)
		}
		return nil
	})
	must.NoError(t, err)
	return files
}

// exported reports whether some component's code defines the metric: as one literal, or as a
// namespace literal and a name literal in the same file (client_golang's Opts{Namespace, Name}).
func exported(sources map[string]string, name string) bool {
	for _, src := range sources {
		if strings.Contains(src, `"`+name+`"`) {
			return true
		}
		for _, ns := range []string{"oasis_router", "oasis_kvcached", "oasis_sim", "vllm"} {
			sep := "_"
			if ns == "vllm" {
				sep = ":"
			}
			if rest, ok := strings.CutPrefix(name, ns+sep); ok && strings.Contains(src, `"`+ns+`"`) && strings.Contains(src, `"`+rest+`"`) {
				return true
			}
		}
	}
	return false
}

func TestDashboardQueriesExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("grafana-dashboard.json")
	must.NoError(t, err)
	var dash struct {
		Title  string `json:"title"`
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	must.NoError(t, json.Unmarshal(data, &dash))
	must.Eq(t, "Oasis", dash.Title)

	sources := goSources(t)
	seen := map[string]bool{}
	for _, p := range dash.Panels {
		if p.Type == "row" {
			continue
		}
		must.SliceNotEmpty(t, p.Targets, must.Sprintf("panel %q has no query", p.Title))
		for _, target := range p.Targets {
			for _, m := range metricName.FindAllString(target.Expr, -1) {
				m = strings.TrimSuffix(m, "_bucket")
				if !seen[m] {
					seen[m] = true
					must.True(t, exported(sources, m), must.Sprintf("panel %q queries %s, which no Oasis component exports", p.Title, m))
				}
			}
		}
	}
	// Every component has panels: router, engines, kvcached, power.
	for _, prefix := range []string{"oasis_router_", "vllm:", "oasis_kvcached_", "oasis_router_worker_power_watts"} {
		found := false
		for m := range seen {
			found = found || strings.HasPrefix(m, prefix)
		}
		must.True(t, found, must.Sprintf("no panel for %s", prefix))
	}
}

func TestPrometheusScrapesOasisServicesByTheirMeta(t *testing.T) {
	data, err := os.ReadFile("prometheus.yml")
	must.NoError(t, err)
	var cfg struct {
		ScrapeConfigs []struct {
			JobName         string `yaml:"job_name"`
			ConsulSDConfigs []struct {
				Services []string `yaml:"services"`
			} `yaml:"consul_sd_configs"`
			RelabelConfigs []struct {
				SourceLabels []string `yaml:"source_labels"`
			} `yaml:"relabel_configs"`
		} `yaml:"scrape_configs"`
	}
	must.NoError(t, yaml.Unmarshal(data, &cfg))

	// The meta keys the scrape jobs rely on must be ones the jobs and recipes register.
	var jobs strings.Builder
	for _, pattern := range []string{"../jobs/*.nomad.hcl", "../recipes/*/*/*/*.nomad.hcl"} {
		files, err := filepath.Glob(pattern)
		must.NoError(t, err)
		for _, f := range files {
			b, err := os.ReadFile(f)
			must.NoError(t, err)
			jobs.Write(b)
		}
	}
	services := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, sd := range sc.ConsulSDConfigs {
			for _, s := range sd.Services {
				services[s] = true
			}
		}
		for _, rc := range sc.RelabelConfigs {
			for _, l := range rc.SourceLabels {
				if key, ok := strings.CutPrefix(l, "__meta_consul_service_metadata_"); ok {
					must.StrContains(t, jobs.String(), key+" ", must.Sprintf("scrape job %s relabels on meta %s, which no job registers", sc.JobName, key))
				}
			}
		}
	}
	for _, s := range []string{"oasis-router", "oasis-engine", "oasis-kvcached"} {
		must.True(t, services[s], must.Sprintf("no scrape job discovers %s", s))
	}
}

// TestAlertsUseExportedMetrics: every oasis_* metric an alerting rule reads is one some component
// exports (promtool's own tests in alerts_test.yml only see the series they are given).
func TestAlertsUseExportedMetrics(t *testing.T) {
	data, err := os.ReadFile("alerts.yml")
	must.NoError(t, err)
	var rules struct {
		Groups []struct {
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	must.NoError(t, yaml.Unmarshal(data, &rules))
	sources := goSources(t)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			for _, m := range metricName.FindAllString(r.Expr, -1) {
				must.True(t, exported(sources, m), must.Sprintf("alert %s reads %s, which no Oasis component exports", r.Alert, m))
			}
		}
	}
	must.Positive(t, n)
}
