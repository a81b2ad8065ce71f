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

// demoJob is the demo recipe's job (recipes/tiny/sim/agg), whose engine group scales.
const demoJob = "tiny-sim-agg"

// autoscalerURLPath is where Up keeps the autoscaler's address for a later `make up` to print.
func autoscalerURLPath(home string) string { return filepath.Join(home, "autoscaler.url") }

// startAutoscaler runs the Nomad Autoscaler (AUTOSCALE=1) against the stack's Prometheus, so the
// demo recipe's `scaling` policy acts, and records its URL.
func startAutoscaler(ctx context.Context, s *testbed.Stack, home string, out io.Writer) error {
	prom, err := PrometheusURL(home, s.Datacenter)
	if err != nil {
		return err
	}
	a, err := s.StartAutoscaler(ctx, prom)
	if err != nil {
		return fmt.Errorf("starting nomad-autoscaler: %w (the stack stays up for inspection; `make down` stops it)", err)
	}
	fmt.Fprintln(out, "  started nomad-autoscaler (Prometheus APM, Nomad target, the oasis-sizing strategy plugin) for the recipes' scaling policies")
	return os.WriteFile(autoscalerURLPath(home), []byte(a.URL+"\n"), 0o644)
}

// printAutoscaler says where the autoscaler is and how to watch it add engines, when Up started one.
func printAutoscaler(out io.Writer, home string) {
	url, err := os.ReadFile(autoscalerURLPath(home))
	if err != nil {
		return
	}
	fmt.Fprintf(out, "Autoscaler: %s   (log: %s)\n", strings.TrimSpace(string(url)),
		filepath.Join(home, "stack", "autoscaler", "autoscaler.log"))
	fmt.Fprintf(out, "Watch:      . %s; watch bin/nomad job status %s   (engines follow the load: recipes/tiny/sim/agg/README.md \"Autoscaling\")\n",
		EnvPath(home), demoJob)
}
