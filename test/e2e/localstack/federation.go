package localstack

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/router/policy"
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
	if err := federate(ctx, f, home, out); err != nil {
		return f, err
	}
	for _, s := range f.DCs {
		if err := runJobs(ctx, root, home, s, out, Options{federated: true}); err != nil {
			return f, err
		}
		if err := startPrometheus(ctx, s, home, out); err != nil {
			return f, err
		}
	}
	printFederation(out, f, home)
	return f, nil
}

// routerTokenDescription names the global Consul token federate makes for the routers.
const routerTokenDescription = "oasis-router, all datacenters (make up DCS=n)"

// federate prepares every datacenter for federated routers, as jobs/README.md ("Router federation
// across datacenters") tells operators to: certificates from a CA made now and kept under home
// (each datacenter's names it),
// one global Consul token with the oasis-router policy (the workload identity's token is local to
// its datacenter and sees nothing in another), both in each region's Nomad variable the router
// job reads, and federation enabled in each datacenter's routing policy (the default policy
// otherwise).
func federate(ctx context.Context, f *testbed.Federation, home string, out io.Writer) error {
	var dcs []string
	for _, s := range f.DCs {
		dcs = append(dcs, s.Datacenter)
	}
	certs, err := makeFederationTLS(home, dcs)
	if err != nil {
		return err
	}
	token, err := f.GlobalConsulToken(ctx, routerTokenDescription, "oasis-router")
	if err != nil {
		return err
	}
	doc := policy.Default()
	enabled := true
	doc.Federation = &policy.Federation{Enabled: &enabled}
	pol, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return err
	}
	for _, s := range f.DCs {
		items := nomadapi.VariableItems{
			"federation_tls_cert": string(certs.Cert[s.Datacenter]),
			"federation_tls_key":  string(certs.Key[s.Datacenter]),
			"federation_tls_ca":   string(certs.CA),
		}
		if token != "" {
			items["consul_token"] = token
		}
		wo := (&nomadapi.WriteOptions{Region: s.Region}).WithContext(ctx)
		if _, _, err := s.Nomad.Variables().Create(&nomadapi.Variable{Path: routerVariable, Items: items}, wo); err != nil {
			return fmt.Errorf("%s: writing the router's variable %s: %w", s.Datacenter, routerVariable, err)
		}
		kv := &consulapi.KVPair{Key: routerPolicyKey, Value: pol}
		if _, err := s.Consul.KV().Put(kv, (&consulapi.WriteOptions{}).WithContext(ctx)); err != nil {
			return fmt.Errorf("%s: writing the routing policy %s: %w", s.Datacenter, routerPolicyKey, err)
		}
	}
	fmt.Fprintf(out, "  federation: certificates from a new CA in %s, a global Consul token for the routers, federation on in every datacenter's policy (%s)\n",
		FederationTLSDir(home), routerPolicyKey)
	return nil
}

// The router job's defaults (jobs/router.nomad.hcl: secrets_variable, kv_prefix).
const (
	routerVariable  = "nomad/jobs/oasis-router"
	routerPolicyKey = "oasis/router/policy"
)

func printFederation(out io.Writer, f *testbed.Federation, home string) {
	for _, s := range f.DCs {
		printURLs(out, s, DCEnvPath(home, s.Datacenter), demoModel)
	}
	printFederationTry(out, f, home)
}

// printFederationTry says how the routers federate and how to watch another datacenter serve a
// request sent to dc1: stop dc1's demo engines and ask dc1's router again.
func printFederationTry(out io.Writer, f *testbed.Federation, home string) {
	dc1 := f.DCs[0]
	router, ok := plainRouter(dc1)
	if !ok {
		return
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		return
	}
	job, err := demoJobID(dc1, root)
	if err != nil {
		return
	}
	var others []string
	for _, s := range f.DCs[1:] {
		others = append(others, s.Datacenter)
	}
	fmt.Fprintln(out)
	fmt.Fprintf(out, "Federation: the routers of %s and %s forward requests to each other (HTTP/3, mutual TLS, certificates\n",
		dc1.Datacenter, strings.Join(others, ", "))
	fmt.Fprintf(out, "            from the CA in %s): a request leaves its datacenter when no engine there\n", FederationTLSDir(home))
	fmt.Fprintln(out, "            serves its model, its admission is full, or another datacenter holds more of its prefix.")
	fmt.Fprintf(out, "Try:        a request to %s served by %s: stop %s's demo engines, then ask %s's router again:\n",
		dc1.Datacenter, strings.Join(others, " or "), dc1.Datacenter, dc1.Datacenter)
	fmt.Fprintf(out, "            . %s; bin/nomad job stop %s\n", DCEnvPath(home, dc1.Datacenter), job)
	fmt.Fprintf(out, "            curl -N %s/chat/completions -H 'Content-Type: application/json' \\\n", router)
	fmt.Fprintln(out, chatBody(demoModel, "Hello from "+dc1.Datacenter+"!"))
	fmt.Fprintf(out, "            curl -s %s/metrics | grep ^oasis_router_federation_forwarded_total   (reason=\"no_local_worker\")\n",
		strings.TrimSuffix(router, "/v1"))
	fmt.Fprintf(out, "            bin/nomad job start %s   (%s's engines again)\n", job, dc1.Datacenter)
}

// demoJobID is the id of the demo recipe's job.
func demoJobID(s *testbed.Stack, root string) (string, error) {
	files, err := filepath.Glob(filepath.Join(root, demoRecipe, "*.nomad.hcl"))
	if err != nil {
		return "", err
	}
	if len(files) == 0 {
		return "", fmt.Errorf("no job file in %s", demoRecipe)
	}
	job, err := s.ParseJobFile(files[0], nil)
	if err != nil {
		return "", fmt.Errorf("%s: %w", files[0], err)
	}
	return *job.ID, nil
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
