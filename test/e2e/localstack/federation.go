package localstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// FederationStatePath is where UpFederation leaves what Down needs.
func FederationStatePath(home string) string { return filepath.Join(home, "federation.json") }

// DCEnvPath is the env file of one datacenter of a federation: EnvPath for the primary, dc1, so
// that `. .oasis/env` works as with one datacenter, and env-<dc> for the others. The management
// tokens in each are the primary's, replicated everywhere.
func DCEnvPath(home, dc string) string {
	if dc == "dc1" {
		return EnvPath(home)
	}
	return filepath.Join(home, "env-"+dc)
}

// UpFederation is `make up DCS=n`: n datacenters (see testbed.StartFederation), each running the
// system jobs and the demo recipe in its own region on its own free ports.
func UpFederation(ctx context.Context, root, home string, n int, out io.Writer) (*testbed.Federation, error) {
	statePath := FederationStatePath(home)
	if f, err := testbed.LoadFederation(statePath); err == nil {
		if _, err := f.DCs[0].Nomad.Agent().Self(); err == nil {
			fmt.Fprintln(out, "The local federation is already up.")
			printFederation(out, f, home)
			return f, nil
		}
		return nil, fmt.Errorf("a federation state exists at %s but its Nomad does not answer; run `make down` first", statePath)
	}
	if _, err := os.Stat(StatePath(home)); err == nil {
		return nil, errors.New("a single-datacenter stack is up; run `make down` first")
	}
	fmt.Fprintf(out, "Starting %d datacenters of Consul and Nomad with the Oasis plugins ...\n", n)
	f, err := testbed.StartFederation(ctx, testbed.FederationOptions{DCs: n, Options: testbed.Options{
		Dir:  filepath.Join(home, "stack"),
		Logf: func(format string, args ...any) { fmt.Fprintf(out, "  "+format+"\n", args...) },
	}})
	if err != nil {
		return nil, err
	}
	if err := f.Save(statePath); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	for _, s := range f.DCs {
		if err := writeEnv(DCEnvPath(home, s.Datacenter), s); err != nil {
			return nil, errors.Join(err, f.Close())
		}
	}
	for _, s := range f.DCs {
		if err := runJobs(ctx, root, home, s, out, Options{}); err != nil {
			return f, err
		}
		if err := startPrometheus(ctx, s, home, out); err != nil {
			return f, err
		}
	}
	printFederation(out, f, home)
	return f, nil
}

func printFederation(out io.Writer, f *testbed.Federation, home string) {
	for _, s := range f.DCs {
		printURLs(out, s, DCEnvPath(home, s.Datacenter))
	}
}

func downFederation(home string, out io.Writer) error {
	f, err := testbed.LoadFederation(FederationStatePath(home))
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "Stopping jobs, Nomad and Consul in %d datacenters ...\n", len(f.DCs))
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.RemoveAll(home); err != nil {
		return err
	}
	fmt.Fprintln(out, "The local federation is down; nothing is left running.")
	return nil
}
