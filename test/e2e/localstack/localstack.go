// Command oasis-stack is `make up` / `make down`: the whole local stack — real Consul and Nomad
// agents with the Oasis plugins loaded, the jobs in jobs/ and the demo recipe — under the
// checkout's .oasis/ directory, left running until `make down`.
package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// demoRecipe is run by `make up` after the system jobs: three simulated engines.
const demoRecipe = "recipes/tiny/sim/agg"

func main() {
	if len(os.Args) != 2 || (os.Args[1] != "up" && os.Args[1] != "down") {
		fmt.Fprintln(os.Stderr, "usage: oasis-stack up|down")
		os.Exit(2)
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		fatal(err)
	}
	home := filepath.Join(root, ".oasis")
	statePath := filepath.Join(home, "stack.json")
	switch os.Args[1] {
	case "up":
		err = up(root, home, statePath)
	case "down":
		err = down(home, statePath)
	}
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "oasis-stack: %v\n", err)
	os.Exit(1)
}

func up(root, home, statePath string) error {
	if s, err := testbed.Load(statePath); err == nil {
		if _, err := s.Nomad.Agent().Self(); err == nil {
			fmt.Println("The local stack is already up.")
			printURLs(s)
			return nil
		}
		return fmt.Errorf("a stack state exists at %s but its Nomad does not answer; run `make down` first", statePath)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	fmt.Println("Starting Consul and Nomad with the Oasis plugins (first run builds the Oasis binaries) ...")
	s, err := testbed.Start(ctx, testbed.Options{
		Dir:  filepath.Join(home, "stack"),
		Logf: func(format string, args ...any) { fmt.Printf("  "+format+"\n", args...) },
	})
	if err != nil {
		return err
	}
	if err := s.Save(statePath); err != nil {
		return errors.Join(err, s.Close())
	}

	files, err := jobFiles(root)
	if err != nil {
		return err
	}
	vars, err := localVariables(s, home)
	if err != nil {
		return errors.Join(err, s.Close())
	}
	for _, f := range files {
		rel, _ := filepath.Rel(root, f)
		fileVars := maps.Clone(vars[""])
		maps.Copy(fileVars, vars[filepath.Base(f)])
		if err := runJob(ctx, s, f, fileVars); err != nil {
			return fmt.Errorf("%s: %w (the stack stays up for inspection; `make down` stops it)", rel, err)
		}
		fmt.Printf("  ran %s\n", rel)
	}
	printURLs(s)
	return nil
}

// jobFiles lists the system jobs and the demo recipe, saying which ones do not exist yet.
func jobFiles(root string) ([]string, error) {
	jobs, err := filepath.Glob(filepath.Join(root, "jobs", "*.nomad.hcl"))
	if err != nil {
		return nil, err
	}
	sort.Strings(jobs)
	if len(jobs) == 0 {
		fmt.Println("  skipped jobs/: no *.nomad.hcl there yet")
	}
	demo, err := filepath.Glob(filepath.Join(root, demoRecipe, "*.nomad.hcl"))
	if err != nil {
		return nil, err
	}
	if len(demo) == 0 {
		fmt.Printf("  skipped %s: not there yet\n", demoRecipe)
	}
	return append(jobs, demo...), nil
}

// localVariables sizes the jobs for one machine: free ports instead of the production static
// ones, small RAM/disk tiers, state under .oasis. Keys are job file names; "" applies to all.
func localVariables(s *testbed.Stack, home string) (map[string]map[string]string, error) {
	ports, err := testbed.FreePorts(4)
	if err != nil {
		return nil, err
	}
	port := func(i int) string { return fmt.Sprint(ports[i]) }
	return map[string]map[string]string{
		"": {
			"oasis_bin_dir": s.BinDir,
			"datacenters":   `["*"]`,
			"consul_addr":   s.ConsulAddr,
			"nomad_addr":    s.NomadAddr,
		},
		"router.nomad.hcl": {"http_port": port(0)},
		"kvcached.nomad.hcl": {
			"resp_port":  port(1),
			"http_port":  port(2),
			"quic_port":  port(3),
			"data_dir":   filepath.Join(home, "kvcached"),
			"ram_bytes":  "256MiB",
			"disk_bytes": "1GiB",
			"memory_mb":  "512",
		},
	}, nil
}

var declaredVariable = regexp.MustCompile(`(?m)^\s*variable\s+"([A-Za-z0-9_-]+)"`)

// runJob submits a jobspec the way `nomad job run -var ...` does, passing only the variables the
// file declares, and waits for its allocations.
func runJob(ctx context.Context, s *testbed.Stack, path string, vars map[string]string) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var assigns []string
	for _, m := range declaredVariable.FindAllStringSubmatch(string(src), -1) {
		if v, ok := vars[m[1]]; ok {
			if !strings.HasPrefix(v, "[") && !isNumber(v) {
				v = fmt.Sprintf("%q", v)
			}
			assigns = append(assigns, fmt.Sprintf("%s = %s", m[1], v))
		}
	}
	job, err := s.Nomad.Jobs().ParseHCLOpts(&nomadapi.JobsParseRequest{
		JobHCL:       string(src),
		Variables:    strings.Join(assigns, "\n"),
		Canonicalize: true,
	})
	if err != nil {
		return fmt.Errorf("parsing: %w", err)
	}
	if _, _, err := s.Nomad.Jobs().Register(job, nil); err != nil {
		return fmt.Errorf("registering: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	_, err = s.WaitAllocsRunning(wctx, *job.ID)
	return err
}

func isNumber(v string) bool {
	_, err := strconv.ParseFloat(v, 64)
	return err == nil
}

func printURLs(s *testbed.Stack) {
	fmt.Println()
	fmt.Printf("Nomad UI:   %s/ui\n", s.NomadAddr)
	fmt.Printf("Consul UI:  http://%s/ui\n", s.ConsulAddr)
	fmt.Printf("Env:        export NOMAD_ADDR=%s CONSUL_HTTP_ADDR=%s\n", s.NomadAddr, s.ConsulAddr)
	routers, _, err := s.Consul.Health().Service("oasis-router", "", true, nil)
	if err != nil || len(routers) == 0 {
		fmt.Println("OpenAI API: no oasis-router registered yet (jobs/router.nomad.hcl not run)")
		return
	}
	svc := routers[0].Service
	base := fmt.Sprintf("http://%s:%d/v1", svc.Address, svc.Port)
	fmt.Printf("OpenAI API: %s\n", base)
	fmt.Printf("Try:        curl -N %s/chat/completions -H 'Content-Type: application/json' \\\n", base)
	fmt.Println(`              -d '{"model":"tiny-sim","stream":true,"messages":[{"role":"user","content":"Hello, Oasis!"}]}'`)
	fmt.Println("Stop:       make down")
}

func down(home, statePath string) error {
	s, err := testbed.Load(statePath)
	if errors.Is(err, os.ErrNotExist) {
		fmt.Println("Nothing to stop: no local stack is up.")
		return os.RemoveAll(home)
	}
	if err != nil {
		return err
	}
	fmt.Println("Stopping jobs, Nomad and Consul ...")
	if err := s.Close(); err != nil {
		return err
	}
	if err := os.RemoveAll(home); err != nil && !errors.Is(err, syscall.ENOENT) {
		return err
	}
	fmt.Println("The local stack is down; nothing is left running.")
	return nil
}
