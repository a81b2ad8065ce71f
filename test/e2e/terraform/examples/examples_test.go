// Package examples applies terraform/examples/single-dc with the real tofu CLI and the freshly
// built Oasis provider against the test bed (real Consul and Nomad with ACLs): the model serves
// through the router with the generated key, a change plans as exactly that change, drift made
// out of band shows in plan, and destroy leaves nothing in Nomad or Consul.
package examples

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tofutest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }

const model = "tiny-sim"

// singleDC is the example's working directory with its variables set for the test bed.
type singleDC struct {
	tf         *tofutest.Tofu
	routerURL  string
	policyKey  string
	keysKey    string
	modelJobID string
}

func newSingleDC(t *testing.T) *singleDC {
	t.Helper()
	tf := tofutest.New(t, tofutest.Options{
		Module:   tofutest.RepoPath(t, "terraform", "examples", "single-dc"),
		Provider: stack.Bin("terraform-provider-oasis"),
		Env:      stack.Env(),
	})
	ports, err := testutil.FreePorts(4)
	must.NoError(t, err)
	vars := map[string]any{
		"region":      stack.Region,
		"datacenters": []string{stack.Datacenter},
		"router_variables": map[string]string{
			"oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr, "nomad_addr": stack.NomadAddr,
			"http_port": strconv.Itoa(ports[0]),
		},
		"kvcached_variables": map[string]string{
			"oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr,
			"resp_port": strconv.Itoa(ports[1]), "http_port": strconv.Itoa(ports[2]), "quic_port": strconv.Itoa(ports[3]),
			"data_dir": t.TempDir(), "ram_bytes": "64MiB", "disk_bytes": "128MiB", "memory_mb": "256",
			"auth_enabled": "false", // no password variable on the test bed (test/e2e/tiers covers it)
		},
		"model_name":  model,
		"model_count": 2,
		"extra_args":  []string{"--speed", "0"},
	}
	data, err := json.Marshal(vars)
	must.NoError(t, err)
	must.NoError(t, os.WriteFile(filepath.Join(tf.Dir, "terraform.tfvars.json"), data, 0o600))
	return &singleDC{tf: tf, routerURL: "http://127.0.0.1:" + strconv.Itoa(ports[0]),
		policyKey: "oasis/router/policy", keysKey: "oasis/router/keys", modelJobID: "oasis-model-" + model}
}

func TestSingleDC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	ex := newSingleDC(t)
	ex.tf.Init(ctx)
	t.Cleanup(func() {
		if t.Failed() { // best effort; the test bed's Close stops whatever is left
			_, _ = ex.tf.Run(context.Background(), "destroy", "-auto-approve", "-no-color")
		}
	})

	t.Run("bad input fails at plan, naming the field", func(t *testing.T) { ex.planRejects(t, ctx) })
	t.Run("apply serves the model through the router", func(t *testing.T) { ex.applyAndServe(t, ctx) })
	t.Run("a change plans as exactly that change", func(t *testing.T) { ex.planChange(t, ctx) })
	t.Run("drift made out of band shows in plan", func(t *testing.T) { ex.planDrift(t, ctx) })
	t.Run("destroy leaves nothing in Nomad or Consul", func(t *testing.T) { ex.destroy(t, ctx) })
}

// planRejects: an engine/offload combination the llm driver refuses and a policy the router
// refuses fail plan, before anything is written, with the field named.
func (ex *singleDC) planRejects(t *testing.T, ctx context.Context) {
	_, err := ex.tf.Plan(ctx, "-var", "kv_offload=hicache")
	must.ErrorContains(t, err, "kv_offload")
	_, err = ex.tf.Plan(ctx, "-var", "routing_policy=fastest")
	must.ErrorContains(t, err, "policy")
	jobs, _, err := stack.Nomad.Jobs().List(nil)
	must.NoError(t, err)
	must.SliceEmpty(t, jobs)
}

func (ex *singleDC) applyAndServe(t *testing.T, ctx context.Context) {
	start := time.Now()
	ex.tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	t.Logf("apply: %s", time.Since(start).Round(time.Second))

	var models []string
	must.NoError(t, ex.tf.Output(ctx, "models", &models))
	must.Eq(t, []string{model}, models)
	var keys map[string]string
	must.NoError(t, ex.tf.Output(ctx, "api_keys", &keys))
	key := keys["team-a"]
	must.StrHasPrefix(t, "sk-", key)

	// The key is in Consul only as its digest.
	pair, _, err := stack.Consul.KV().Get(ex.keysKey, nil)
	must.NoError(t, err)
	must.NotNil(t, pair)
	must.StrNotContains(t, string(pair.Value), key)

	testutil.Eventually(t, 90*time.Second, "a chat completion through the router with the generated key", func() bool {
		return chat(ctx, ex.routerURL, key) == http.StatusOK
	})
	must.EqOp(t, http.StatusUnauthorized, chat(ctx, ex.routerURL, "sk-not-a-key"))
}

// planChange changes the routing policy and the model's count: the plan updates exactly those
// two resources, and apply makes them so.
func (ex *singleDC) planChange(t *testing.T, ctx context.Context) {
	args := []string{"-var", "routing_policy=round_robin", "-var", "model_count=3"}
	plan, err := ex.tf.Plan(ctx, args...)
	must.NoError(t, err)
	must.Eq(t, []string{"oasis_model.this: update", "oasis_router_policy.this: update"}, summary(plan.Changed()))
	ex.tf.Must(ctx, append([]string{"apply", "-auto-approve", "-no-color"}, args...)...)

	_, err = stack.WaitServicePassing(ctx, "oasis-engine", 3)
	must.NoError(t, err)
	pair, _, err := stack.Consul.KV().Get(ex.policyKey, nil)
	must.NoError(t, err)
	must.StrContains(t, string(pair.Value), `"round_robin"`)
	plan, err = ex.tf.Plan(ctx, args...)
	must.NoError(t, err)
	must.SliceEmpty(t, plan.Changed())
}

// planDrift edits the policy in Consul and scales the model's job in Nomad behind the state's
// back: plan shows both resources to be put back, and nothing else.
func (ex *singleDC) planDrift(t *testing.T, ctx context.Context) {
	_, err := stack.Consul.KV().Put(&consulapi.KVPair{Key: ex.policyKey, Value: []byte(`{"policy":"least_load"}`)}, nil)
	must.NoError(t, err)
	must.NoError(t, stack.WaitDeployment(ctx, ex.modelJobID)) // Nomad scales no job mid-deployment
	one := 1
	_, _, err = stack.Nomad.Jobs().Scale(ex.modelJobID, "engine", &one, "out of band", false, nil, nil)
	must.NoError(t, err)

	args := []string{"-var", "routing_policy=round_robin", "-var", "model_count=3"}
	plan, err := ex.tf.Plan(ctx, args...)
	must.NoError(t, err)
	must.Eq(t, []string{"oasis_model.this: update", "oasis_router_policy.this: update"}, summary(plan.Changed()))
	for _, c := range plan.Changed() {
		switch c.Type {
		case "oasis_model":
			must.Eq(t, 1.0, c.Change.Before["engine_count"])
			must.Eq(t, 3.0, c.Change.After["engine_count"])
		case "oasis_router_policy":
			must.StrContains(t, c.Change.Before["document"].(string), "least_load")
		}
	}
}

func (ex *singleDC) destroy(t *testing.T, ctx context.Context) {
	start := time.Now()
	ex.tf.Must(ctx, "destroy", "-auto-approve", "-no-color")
	t.Logf("destroy: %s", time.Since(start).Round(time.Second))
	ex.destroyed(t)
}

// destroyed asserts nothing of the example is left: no job in Nomad (purged, not just
// stopped), no Oasis service in Consul, no key under the router's prefix.
func (ex *singleDC) destroyed(t *testing.T) {
	jobs, _, err := stack.Nomad.Jobs().List(&nomadapi.QueryOptions{Namespace: "*"})
	must.NoError(t, err)
	var left []string
	for _, j := range jobs {
		left = append(left, j.ID)
	}
	must.SliceEmpty(t, left, must.Sprintf("jobs left in Nomad: %v", left))
	testutil.Eventually(t, 60*time.Second, "Oasis services to leave Consul", func() bool {
		svcs, _, err := stack.Consul.Catalog().Services(nil)
		if err != nil {
			return false
		}
		for name := range svcs {
			if strings.HasPrefix(name, "oasis-") {
				return false
			}
		}
		return true
	})
	pairs, _, err := stack.Consul.KV().Keys("oasis/", "", nil)
	must.NoError(t, err)
	must.SliceEmpty(t, pairs)
}

// TestTwoRegionValidates: the two-region example initialises from the mirror and validates
// against the provider's schema (applying it needs two federated regions: the federation
// tests run those).
func TestTwoRegionValidates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tf := tofutest.New(t, tofutest.Options{
		Module:   tofutest.RepoPath(t, "terraform", "examples", "two-region"),
		Provider: stack.Bin("terraform-provider-oasis"),
	})
	tf.Init(ctx)
	out := tf.Must(ctx, "validate", "-no-color")
	must.StrContains(t, out, "The configuration is valid")
}

func summary(changes []tofutest.Change) []string {
	var out []string
	for _, c := range changes {
		out = append(out, c.Address+": "+strings.Join(c.Change.Actions, ","))
	}
	slices.Sort(out)
	return out
}

func chat(ctx context.Context, base, key string) int {
	body := `{"model":"` + model + `","max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	return resp.StatusCode
}
