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

// prometheusURLPath is where Up keeps the Prometheus address for a later `make up` to print.
func prometheusURLPath(home string) string { return filepath.Join(home, "prometheus.url") }

// startPrometheus runs Prometheus with the shipped scrape configuration (observability/prometheus.yml,
// rendered for the stack's Consul address and a service discovery token) and records its URL.
// The stack's directory holds its data, so `make down` stops it with the agents.
func startPrometheus(ctx context.Context, s *testbed.Stack, home string, out io.Writer) error {
	p, err := s.StartPrometheus(ctx)
	if err != nil {
		return fmt.Errorf("starting prometheus: %w (the stack stays up for inspection; `make down` stops it)", err)
	}
	fmt.Fprintln(out, "  started prometheus with observability/prometheus.yml")
	return os.WriteFile(prometheusURLPath(home), []byte(p.URL+"\n"), 0o644)
}

// printPrometheus prints the Prometheus URL Up recorded under home, if any.
func printPrometheus(out io.Writer, home string) {
	if url, err := PrometheusURL(home); err == nil {
		fmt.Fprintf(out, "Prometheus: %s   (observability/prometheus.yml)\n", url)
	}
}

// PrometheusURL returns the address of the Prometheus Up started under home.
func PrometheusURL(home string) (string, error) {
	url, err := os.ReadFile(prometheusURLPath(home))
	if err != nil {
		return "", fmt.Errorf("no prometheus recorded under %s: %w", home, err)
	}
	return strings.TrimSpace(string(url)), nil
}
