// Package provider tests terraform-provider-oasis's Nomad resources
// (oasis_model, oasis_system_jobs) end to end: the real tofu CLI applies a
// module with the freshly built provider to the test bed (Consul + Nomad
// with ACLs, the llm driver running the simulator).
package provider

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tofutest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

// The clients allow task binaries: TestModelTimeout's model names a binary
// that does not exist (an engine that cannot start), and its provider block
// says so in driver_policy.
func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Options{LLMPluginExtra: "allow_task_binary = true"}, &stack))
}

const (
	modelName  = "tf-sim"
	modelJobID = "oasis-model-" + modelName
)

// module prepares the testdata module with the stack's addresses, free
// ports and the provider the stack built; args are the -var arguments
// every command needs.
func module(t *testing.T) (*tofutest.Tofu, []string, int) {
	t.Helper()
	ports, err := testutil.FreePorts(4)
	must.NoError(t, err)
	tf := tofutest.New(t, tofutest.Options{
		Module:   "testdata/stack",
		Provider: stack.Bin("terraform-provider-oasis"),
		Env:      stack.Env(),
	})
	vars := map[string]string{
		"bin_dir":            stack.BinDir,
		"consul_addr":        stack.ConsulAddr,
		"nomad_addr":         stack.NomadAddr,
		"router_port":        strconv.Itoa(ports[0]),
		"kvcached_resp_port": strconv.Itoa(ports[1]),
		"kvcached_http_port": strconv.Itoa(ports[2]),
		"kvcached_quic_port": strconv.Itoa(ports[3]),
		"kvcached_data_dir":  filepath.Join(t.TempDir(), "kvcached"),
	}
	var args []string
	for k, v := range vars {
		args = append(args, "-var", k+"="+v)
	}
	return tf, args, ports[0]
}

func with(args []string, more ...string) []string {
	return append(append([]string(nil), args...), more...)
}

func TestModelAndSystemJobs(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 9*time.Minute)
	defer cancel()
	tf, args, routerPort := module(t)
	tf.Init(ctx)
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_, _ = tf.Run(context.Background(), with([]string{"destroy", "-auto-approve", "-no-color"}, args...)...)
		}
	})

	start := time.Now()
	tf.Must(ctx, with([]string{"apply", "-auto-approve", "-no-color"}, args...)...)
	t.Logf("apply: %s", time.Since(start).Round(time.Millisecond))

	t.Run("two passing engines and a serving router", func(t *testing.T) {
		must.EqOp(t, 2, passing(t, ctx, modelName))
		var healthy int
		must.NoError(t, tf.Output(ctx, "healthy_instances", &healthy))
		must.EqOp(t, 2, healthy)
		for _, id := range []string{"oasis-router", "oasis-kvcached", modelJobID} {
			job, _, err := stack.Nomad.Jobs().Info(id, nil)
			must.NoError(t, err)
			must.EqOp(t, "terraform-provider-oasis", job.Meta["oasis_managed_by"])
		}
		chatThroughRouter(t, ctx, routerPort)
	})

	t.Run("no changes after apply", func(t *testing.T) {
		p, err := tf.Plan(ctx, args...)
		must.NoError(t, err)
		must.SliceEmpty(t, p.Changed())
	})

	t.Run("a new count plans an update of the model only", func(t *testing.T) {
		p, err := tf.Plan(ctx, with(args, "-var", "engine_count=3")...)
		must.NoError(t, err)
		changed := p.Changed()
		must.Len(t, 1, changed)
		must.EqOp(t, "oasis_model.sim", changed[0].Address)
		must.Eq(t, []string{"update"}, changed[0].Change.Actions)
		must.Eq(t, any(2.0), changed[0].Change.Before["engine_count"])
		must.Eq(t, any(3.0), changed[0].Change.After["engine_count"])
	})

	t.Run("nomad job scale shows as drift", func(t *testing.T) {
		// Nomad refuses to scale a job while a deployment runs (the
		// recipes' min_healthy_time is 30s).
		must.NoError(t, stack.WaitDeployment(ctx, modelJobID))
		one := 1
		_, _, err := stack.Nomad.Jobs().Scale(modelJobID, "engine", &one, "out of band", false, nil, nil)
		must.NoError(t, err)
		p, err := tf.Plan(ctx, args...)
		must.NoError(t, err)
		changed := p.Changed()
		must.Len(t, 1, changed)
		must.EqOp(t, "oasis_model.sim", changed[0].Address)
		must.Eq(t, any(1.0), changed[0].Change.Before["engine_count"])
		must.Eq(t, any(2.0), changed[0].Change.After["engine_count"])
		// Apply puts it back, waiting for both engines again.
		tf.Must(ctx, with([]string{"apply", "-auto-approve", "-no-color"}, args...)...)
		must.EqOp(t, 2, passing(t, ctx, modelName))
	})

	t.Run("a system job changed outside Terraform plans an update", func(t *testing.T) {
		job, _, err := stack.Nomad.Jobs().Info("oasis-router", nil)
		must.NoError(t, err)
		delete(job.Meta, "oasis_tf_hash")
		job.Meta["changed_by"] = "hand"
		_, _, err = stack.Nomad.Jobs().Register(job, nil)
		must.NoError(t, err)
		p, err := tf.Plan(ctx, args...)
		must.NoError(t, err)
		changed := p.Changed()
		must.Len(t, 1, changed)
		must.EqOp(t, "oasis_system_jobs.this", changed[0].Address)
		must.Eq(t, []string{"update"}, changed[0].Change.Actions)
		// Apply resubmits the module's jobspec: no changes after it.
		tf.Must(ctx, with([]string{"apply", "-auto-approve", "-no-color"}, args...)...)
		job, _, err = stack.Nomad.Jobs().Info("oasis-router", nil)
		must.NoError(t, err)
		must.MapNotContainsKey(t, job.Meta, "changed_by")
		p, err = tf.Plan(ctx, args...)
		must.NoError(t, err)
		must.SliceEmpty(t, p.Changed())
	})

	t.Run("kvcached turned off is stopped and purged", func(t *testing.T) {
		off := with(args, "-var", "kvcached_enabled=false")
		p, err := tf.Plan(ctx, off...)
		must.NoError(t, err)
		changed := p.Changed()
		must.Len(t, 1, changed)
		must.EqOp(t, "oasis_system_jobs.this", changed[0].Address)
		tf.Must(ctx, with([]string{"apply", "-auto-approve", "-no-color"}, off...)...)
		_, _, err = stack.Nomad.Jobs().Info("oasis-kvcached", nil)
		must.ErrorContains(t, err, "404")
		p, err = tf.Plan(ctx, off...)
		must.NoError(t, err)
		must.SliceEmpty(t, p.Changed())
		// On again for the rest of the test (and destroy's check).
		tf.Must(ctx, with([]string{"apply", "-auto-approve", "-no-color"}, args...)...)
		_, _, err = stack.Nomad.Jobs().Info("oasis-kvcached", nil)
		must.NoError(t, err)
	})

	t.Run("a bad engine and offload combination fails plan", func(t *testing.T) {
		_, err := tf.Plan(ctx, with(args, "-var", "kv_offload=hicache")...)
		must.Error(t, err)
		got := strings.Join(strings.Fields(err.Error()), " ")
		must.StrContains(t, got, `kv_offload: "hicache" is not supported by engine sim`)
		must.StrContains(t, got, "kv_offload = var.kv_offload")
	})

	t.Run("import by region/name reads the model back", func(t *testing.T) {
		tf.Must(ctx, "state", "rm", "-no-color", "oasis_model.sim")
		tf.Must(ctx, with(with([]string{"import", "-no-color"}, args...), "oasis_model.sim", "global/"+modelName)...)
		p, err := tf.Plan(ctx, args...)
		must.NoError(t, err)
		// Only timeout, which Nomad does not hold, differs from the module.
		must.Len(t, 1, p.Changed())
		for _, c := range p.Changed() {
			must.EqOp(t, "oasis_model.sim", c.Address)
			must.Eq(t, []string{"update"}, c.Change.Actions)
			must.Eq(t, []string{"timeout"}, changedKeys(c), must.Sprintf("before %v after %v", c.Change.Before, c.Change.After))
		}
	})

	t.Run("a job stopped outside Terraform plans its creation", func(t *testing.T) {
		_, _, err := stack.Nomad.Jobs().Deregister(modelJobID, false, nil)
		must.NoError(t, err)
		p, err := tf.Plan(ctx, args...)
		must.NoError(t, err)
		changed := p.Changed()
		must.Len(t, 1, changed)
		must.EqOp(t, "oasis_model.sim", changed[0].Address)
		must.Eq(t, []string{"create"}, changed[0].Change.Actions)
		tf.Must(ctx, with([]string{"apply", "-auto-approve", "-no-color"}, args...)...)
		must.EqOp(t, 2, passing(t, ctx, modelName))
	})

	start = time.Now()
	tf.Must(ctx, with([]string{"destroy", "-auto-approve", "-no-color"}, args...)...)
	destroyed = true
	t.Logf("destroy: %s", time.Since(start).Round(time.Millisecond))

	t.Run("destroy purges the jobs", func(t *testing.T) {
		for _, id := range []string{"oasis-router", "oasis-kvcached", modelJobID} {
			_, _, err := stack.Nomad.Jobs().Info(id, nil)
			must.ErrorContains(t, err, "404", must.Sprintf("job %s still known to Nomad", id))
		}
		entries, _, err := stack.Consul.Health().Service("oasis-engine", "", false,
			(&consulapi.QueryOptions{Filter: fmt.Sprintf("Service.Meta.oasis_model == %q", modelName)}).WithContext(ctx))
		must.NoError(t, err)
		must.SliceEmpty(t, entries)
		// The system jobs' services leave Consul as their tasks stop.
		testutil.EventuallyEvery(t, 15*time.Second, 200*time.Millisecond, "the system jobs' services to leave Consul", func() bool {
			for _, svc := range []string{"oasis-router", "oasis-kvcached"} {
				entries, _, err := stack.Consul.Health().Service(svc, "", false, (&consulapi.QueryOptions{}).WithContext(ctx))
				if err != nil || len(entries) > 0 {
					return false
				}
			}
			return true
		})
	})
}

// changedKeys lists the attributes a change sets to a known new value.
func changedKeys(c tofutest.Change) []string {
	var keys []string
	for k, after := range c.Change.After {
		if fmt.Sprint(after) != fmt.Sprint(c.Change.Before[k]) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}

// passing counts the model's passing oasis-engine instances in Consul.
func passing(t *testing.T, ctx context.Context, model string) int {
	t.Helper()
	entries, _, err := stack.Consul.Health().Service("oasis-engine", "", true,
		(&consulapi.QueryOptions{Filter: fmt.Sprintf("Service.Meta.oasis_model == %q", model)}).WithContext(ctx))
	must.NoError(t, err)
	return len(entries)
}

// chatThroughRouter waits until the router serves the model and sends one
// chat completion through it.
func chatThroughRouter(t *testing.T, ctx context.Context, port int) {
	t.Helper()
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port)
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":4}`, modelName)
	var text string
	// ErrorFunc: a failure shows the last answer, not the first.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
		must.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return fmt.Errorf("no chat completion through the router: %w", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text = string(b)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("no chat completion through the router: last %d %s", resp.StatusCode, text)
		}
		return nil
	}), wait.Timeout(90*time.Second), wait.Gap(500*time.Millisecond)))
	must.StrContains(t, text, `"choices"`)
}

// An engine that never passes fails apply after the timeout with the
// allocations' task states; the resource is tainted and destroy purges it.
func TestModelTimeout(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	tf := tofutest.New(t, tofutest.Options{
		Module:   "testdata/broken",
		Provider: stack.Bin("terraform-provider-oasis"),
		Env:      stack.Env(),
	})
	tf.Init(ctx)
	t.Cleanup(func() { _, _ = tf.Run(context.Background(), "destroy", "-auto-approve", "-no-color") })

	start := time.Now()
	_, err := tf.Run(ctx, "apply", "-auto-approve", "-no-color")
	must.Error(t, err)
	t.Logf("apply failed after %s", time.Since(start).Round(time.Millisecond))
	got := strings.Join(strings.Fields(err.Error()), " ")
	t.Logf("apply error: %s", got[strings.Index(got, "Error:"):])
	must.StrContains(t, got, "waiting for 1 passing oasis-engine instances of model tf-broken")
	must.StrContains(t, got, "allocations:")
	must.StrContains(t, got, "engine/")
	must.StrContains(t, got, "sim=dead (failed): Driver Failure")
	must.StrContains(t, got, "/nonexistent/oasis-sim")
	state := tf.Must(ctx, "state", "list")
	must.StrContains(t, state, "oasis_model.broken")

	tf.Must(ctx, "destroy", "-auto-approve", "-no-color")
	_, _, err = stack.Nomad.Jobs().Info("oasis-model-tf-broken", nil)
	must.ErrorContains(t, err, "404")
}

// A disaggregated model runs prefill_count prefill and decode_count decode
// engines, each registered with its role, and apply waits for all of them.
func TestDisaggregatedModel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	tf := tofutest.New(t, tofutest.Options{
		Module:   "testdata/disagg",
		Provider: stack.Bin("terraform-provider-oasis"),
		Env:      stack.Env(),
	})
	tf.Init(ctx)
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			_, _ = tf.Run(context.Background(), "destroy", "-auto-approve", "-no-color")
		}
	})
	tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	var healthy int
	must.NoError(t, tf.Output(ctx, "healthy_instances", &healthy))
	must.EqOp(t, 3, healthy)
	entries, _, err := stack.Consul.Health().Service("oasis-engine", "", true,
		(&consulapi.QueryOptions{Filter: `Service.Meta.oasis_model == "tf-sim-pd"`}).WithContext(ctx))
	must.NoError(t, err)
	roles := map[string]int{}
	for _, e := range entries {
		roles[e.Service.Meta["oasis_role"]]++
	}
	must.Eq(t, map[string]int{"prefill": 1, "decode": 2}, roles)
	p, err := tf.Plan(ctx)
	must.NoError(t, err)
	must.SliceEmpty(t, p.Changed())
	tf.Must(ctx, "destroy", "-auto-approve", "-no-color")
	destroyed = true
	must.EqOp(t, 0, passing(t, ctx, "tf-sim-pd"))
}
