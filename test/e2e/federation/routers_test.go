package federation

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// fedPolicy turns federation on in a datacenter's routing policy.
const fedPolicy = `{"policy":"round_robin","federation":{"enabled":true}}`

// TestRoutersFederateAcrossRegions runs jobs/router.nomad.hcl with federation in both regions, as
// jobs/README.md says to: certificates and a global Consul token (made in the primary with the
// oasis-router policy) in each region's Nomad variable, federation on in each datacenter's policy
// document. The model's only engine runs in dc2; a streamed request to dc1's router is forwarded
// to dc2 (no local worker) and arrives whole, and dc1 counts the forward. This is what fails
// without the global token: dc1's router, with its workload identity's dc1-local token, would
// see no router in dc2.
func TestRoutersFederateAcrossRegions(t *testing.T) {
	dc1, dc2 := fed.DC("dc1"), fed.DC("dc2")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	const fedModel = "fed-routed"
	runEngineIn(t, ctx, dc2, "fed-engine", fedModel)

	token, _, err := dc1.Consul.ACL().TokenCreate(&consulapi.ACLToken{Description: "oasis-router, all datacenters",
		Policies: []*consulapi.ACLTokenPolicyLink{{Name: "oasis-router"}}}, nil)
	must.NoError(t, err)
	ca := tlsfilestest.NewCA(t, "oasis-federation")
	urls := map[string]string{}
	for _, s := range []*testbed.Stack{dc1, dc2} {
		// Each datacenter's routers have their own certificate: it names
		// the datacenter they speak for (pki.RouterURI).
		leaf := ca.IssueRouter(t, s.Datacenter, "127.0.0.1")
		_, _, err := s.Nomad.Variables().Create(&nomadapi.Variable{Path: "nomad/jobs/oasis-router", Items: nomadapi.VariableItems{
			"consul_token": token.SecretID, "federation_tls_cert": string(leaf.CertPEM),
			"federation_tls_key": string(leaf.KeyPEM), "federation_tls_ca": string(ca.PEM)}}, nil)
		must.NoError(t, err)
		_, err = s.Consul.KV().Put(&consulapi.KVPair{Key: "oasis/router/policy", Value: []byte(fedPolicy)}, nil)
		must.NoError(t, err)
		urls[s.Datacenter] = runFederatedRouter(t, ctx, s, fedModel)
	}

	var last string
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		events, err := streamThrough(ctx, urls["dc1"], fedModel)
		last = fmt.Sprint(events, err)
		return err == nil
	}), wait.Timeout(60*time.Second), wait.Gap(time.Second)), must.Func(func() string { logRouterTask(t, dc1); return "last: " + last }))
	must.Greater(t, 0, routerMetric(t, urls["dc1"], "oasis_router_federation_forwarded_total",
		map[string]string{"dc": "dc2", "reason": "no_local_worker"}))
	must.Eq(t, 0, routerMetric(t, urls["dc2"], "oasis_router_federation_forwarded_total", nil),
		must.Sprint("dc2 forwarded a request it had an engine for, or a forwarded one"))
}

func runEngineIn(t *testing.T, ctx context.Context, s *testbed.Stack, id, model string) {
	t.Helper()
	job, err := s.ParseJobHCL(testbed.SimEngine{ID: id, Model: model}.HCL())
	must.NoError(t, err)
	job.Region = &s.Region
	_, _, err = s.Nomad.Jobs().Register(job, nil)
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, s.StopJob(context.Background(), id)) })
	_, err = s.WaitServicePassing(ctx, "oasis-engine", 1)
	must.NoError(t, err)
}

// runFederatedRouter runs jobs/router.nomad.hcl in s's region with federation on and returns
// the API's URL.
func runFederatedRouter(t *testing.T, ctx context.Context, s *testbed.Stack, model string) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	ports, err := testutil.FreePorts(2)
	must.NoError(t, err)
	jctx, jcancel := context.WithTimeout(ctx, 90*time.Second)
	defer jcancel()
	err = s.RunJobFile(jctx, filepath.Join(root, "jobs", "router.nomad.hcl"), map[string]string{
		"region": s.Region, "oasis_bin_dir": s.BinDir, "consul_addr": s.ConsulAddr, "nomad_addr": s.NomadAddr,
		"http_port": strconv.Itoa(ports[0]), "federation_enabled": "true", "federation_port": strconv.Itoa(ports[1]),
		"federation_dc": s.Datacenter, "federation_models": fmt.Sprintf("[%q]", model),
	})
	if err != nil {
		logRouterTask(t, s)
	}
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, s.StopJob(context.Background(), "oasis-router")) })
	return "http://127.0.0.1:" + strconv.Itoa(ports[0])
}

// logRouterTask logs the router allocations' task events and stderr, for a failure message.
func logRouterTask(t *testing.T, s *testbed.Stack) {
	allocs, _, err := s.Nomad.Jobs().Allocations("oasis-router", true, nil)
	if err != nil {
		t.Logf("%s: listing router allocations: %v", s.Datacenter, err)
		return
	}
	for _, a := range allocs {
		for name, st := range a.TaskStates {
			for _, e := range st.Events {
				t.Logf("%s %s %s: %s %s", s.Datacenter, a.ID[:8], name, e.Type, e.DisplayMessage)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		text, _ := s.TaskLog(ctx, a.ID, "router", "stderr")
		cancel()
		t.Logf("%s %s router stderr:\n%s", s.Datacenter, a.ID[:8], text)
	}
}

// streamThrough sends a streamed chat completion and returns its SSE data payloads; an error
// unless it ends with [DONE] after at least one chunk.
func streamThrough(ctx context.Context, url, model string) ([]string, error) {
	body := `{"model":"` + model + `","stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("status %s", resp.Status)
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, data)
		}
	}
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		return events, fmt.Errorf("stream did not end with [DONE] after a chunk: %v (%v)", events, sc.Err())
	}
	return events, nil
}

// routerMetric sums a router's counter over the series whose labels include want.
func routerMetric(t *testing.T, url, name string, want map[string]string) float64 {
	t.Helper()
	ms, err := testutil.ScrapeMetrics(context.Background(), nil, url+"/metrics")
	must.NoError(t, err)
	return ms.Sum(name, want)
}
