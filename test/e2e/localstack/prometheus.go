package localstack

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// prometheusURLPath is where Up keeps datacenter dc's Prometheus address for a later `make up`
// to print: prometheus.url for dc1 (the only one without DCS), prometheus-<dc>.url for the others.
func prometheusURLPath(home, dc string) string {
	if dc == "dc1" {
		return filepath.Join(home, "prometheus.url")
	}
	return filepath.Join(home, "prometheus-"+dc+".url")
}

// startPrometheus runs Prometheus with the shipped scrape configuration (observability/prometheus.yml,
// rendered for the stack's Consul address and a service discovery token) and records its URL.
// The stack's directory holds its data, so `make down` stops it with the agents.
func startPrometheus(ctx context.Context, s *testbed.Stack, home string, out io.Writer) error {
	p, err := s.StartPrometheus(ctx)
	if err != nil {
		return fmt.Errorf("starting prometheus: %w (the stack stays up for inspection; `make down` stops it)", err)
	}
	fmt.Fprintf(out, "  started prometheus for %s with observability/prometheus.yml\n", s.Datacenter)
	return os.WriteFile(prometheusURLPath(home, s.Datacenter), []byte(p.URL+"\n"), 0o644)
}

// printPrometheus prints the Prometheus URL Up recorded under home for dc, if any.
func printPrometheus(out io.Writer, home, dc string) {
	if url, err := PrometheusURL(home, dc); err == nil {
		fmt.Fprintf(out, "Prometheus: %s   (observability/prometheus.yml)\n", url)
	}
}

// PrometheusURL returns the address of the Prometheus Up started under home for datacenter dc
// ("dc1" without DCS): each datacenter's scrapes that datacenter's services, through its Consul.
func PrometheusURL(home, dc string) (string, error) {
	url, err := os.ReadFile(prometheusURLPath(home, dc))
	if err != nil {
		return "", fmt.Errorf("no prometheus recorded under %s: %w", home, err)
	}
	return strings.TrimSpace(string(url)), nil
}
