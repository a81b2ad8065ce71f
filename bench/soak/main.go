// Command soak runs the local stack (`make up`: Consul, Nomad, the router and
// kvcached system jobs, three oasis-sim engines) under mixed load for a
// bounded time: streaming and whole completions, clients that cancel
// mid-stream, bad input, kvcached SET/GET, and engine restarts. It samples
// the router's and kvcached's RSS and goroutines, prints what was served and
// what failed by cause, and exits 1 when either process grows without bound
// or a request was lost without an error (a cut the client could not tell
// from an answer).
//
//	go run ./bench/soak -duration 10m      (make soak)
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/oasis-llm/oasis/test/e2e/localstack"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

type options struct {
	duration, sample, restartEvery time.Duration
	workers                        int
	out                            string
}

func main() {
	var o options
	flag.DurationVar(&o.duration, "duration", 10*time.Minute, "how long the load runs")
	flag.DurationVar(&o.sample, "sample", 5*time.Second, "how often RSS and goroutines are sampled")
	flag.DurationVar(&o.restartEvery, "restart-every", time.Minute, "restart one engine this often (0: never)")
	flag.IntVar(&o.workers, "workers", 8, "concurrent clients")
	flag.StringVar(&o.out, "out", "bench/out/soak.json", "where the samples and outcomes are written")
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run(o options) (err error) {
	root, err := testbed.RepoRoot()
	if err != nil {
		return err
	}
	home, err := os.MkdirTemp("", "oasis-soak-")
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.duration+20*time.Minute)
	defer cancel()
	s, err := localstack.Up(ctx, root, home, os.Stdout, localstack.Options{})
	defer func() {
		if derr := localstack.Down(home, os.Stdout); err == nil {
			err = derr
		}
	}()
	if err != nil {
		return err
	}
	tgt, err := findTargets(s)
	if err != nil {
		return err
	}
	fmt.Printf("\nsoak: %s of mixed load, %d clients, an engine restart every %s; router %s, kvcached %s\n",
		o.duration, o.workers, o.restartEvery, tgt.routerURL, tgt.kvcachedAddr)
	rep := soak(ctx, s, tgt, o)
	rep.print(os.Stdout)
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		fmt.Printf("load average at the end: %s", b)
	}
	if o.out != "" {
		if err := writeJSON(filepath.Join(root, o.out), rep); err != nil {
			return err
		}
	}
	if faults := rep.verdict(); len(faults) > 0 {
		return fmt.Errorf("failed: %v", faults)
	}
	fmt.Println("soak: passed")
	return nil
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}
