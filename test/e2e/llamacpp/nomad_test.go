package llamacpp

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/enginestats"
)

// engineTag marks this package's engines in Consul; the router selects by it.
const engineTag = "llamacpp-e2e"

// parallel is each engine's slot count (-np).
const parallel = 2

// engineJob is one llama-server engine run by the llm driver, registered as the
// oasis-engine service with the convention of recipes/llama3-8b/llama-cpp/cpu: no KV
// events, the router models the cache from its own decisions (oasis_kv_capacity).
func engineJob(id, model string) string {
	return fmt.Sprintf(`
job %[1]q {
  datacenters = ["*"]
  type        = "service"

  group "engine" {
    network {
      port "http" {}
    }
    restart {
      attempts = 0
      mode     = "fail"
    }
    reschedule {
      attempts  = 0
      unlimited = false
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-llama_cpp", "role-both", %[4]q]
      meta {
        oasis_model        = %[2]q
        oasis_engine       = "llama_cpp"
        oasis_role         = "both"
        oasis_kv_events    = ""
        oasis_metrics_path = "/metrics"
        oasis_block_size   = ""
        oasis_node         = "${node.unique.id}"
        oasis_kv_capacity  = "gpu=4096"
      }
      check {
        type     = "http"
        path     = "/health"
        interval = "1s"
        timeout  = "1s"
      }
    }

    task "engine" {
      driver       = "llm"
      kill_signal  = "SIGTERM"
      kill_timeout = "10s"
      config {
        engine            = "llama_cpp"
        model             = %[3]q
        served_model_name = %[2]q
        port              = "http"
        max_model_len     = 4096
        extra_args        = ["-np", "%[5]d", "-t", "1", "-tb", "1"]
      }
      resources {
        cpu    = 500
        memory = 512
      }
    }
  }
}
`, id, model, modelPath, engineTag, parallel)
}

// runEngines runs n engine jobs and waits until Consul passes every one; the cleanup
// stops them.
func runEngines(t testing.TB, ctx context.Context, prefix, model string, n int) []string {
	t.Helper()
	return runEnginesWith(t, ctx, prefix, model, n, engineJob)
}

// runEnginesWith is runEngines with each engine's job from job (engineJob's, changed).
func runEnginesWith(t testing.TB, ctx context.Context, prefix, model string, n int, job func(id, model string) string) []string {
	t.Helper()
	var ids []string
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("%s%d", prefix, i)
		_, err := stack.RunJobHCL(ctx, job(id, model))
		must.NoError(t, err)
		ids = append(ids, id)
		t.Cleanup(func() { _ = stack.StopJob(context.Background(), id) })
	}
	for _, id := range ids {
		_, err := stack.WaitAllocsRunning(ctx, id)
		must.NoError(t, err)
	}
	var addrs []string
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "passing llama.cpp engines in Consul with their addresses", func() bool {
		entries, _, err := stack.Consul.Health().Service("oasis-engine", engineTag, true, nil)
		if err != nil {
			return false
		}
		addrs = addrs[:0]
		// Nomad names a Consul service "_nomad-task-<alloc>-<group>-<service>-<port>":
		// the job is not in it, the model in the meta is.
		for _, e := range entries {
			if e.Service.Meta["oasis_model"] == model {
				addrs = append(addrs, hostPort(e.Service.Address, e.Service.Port))
			}
		}
		return len(addrs) == n
	})
	return addrs
}

func taskEvents(t *testing.T, jobID string) []string {
	t.Helper()
	allocs, _, err := stack.Nomad.Jobs().Allocations(jobID, true, nil)
	must.NoError(t, err)
	must.SliceNotEmpty(t, allocs)
	alloc, _, err := stack.Nomad.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	var out []string
	if ts := alloc.TaskStates["engine"]; ts != nil {
		for _, e := range ts.Events {
			out = append(out, e.Type+": "+e.DisplayMessage+" "+e.DriverMessage+" "+e.DriverError)
		}
	}
	return out
}

// The llm driver launches the real llama-server: Consul passes its health check, the
// driver reports it ready, its /metrics feed the router's engine stats, it has the slots
// -np asked for, and `nomad job stop` ends it gracefully (SIGTERM, exit 0, the task
// complete rather than failed).
func TestDriverRunsLlamaServer(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	addrs := runEngines(t, ctx, "llama-driver", "tiny-driver", 1)
	addr := addrs[0]

	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		for _, e := range taskEvents(t, "llama-driver1") {
			if strings.Contains(e, "Engine ready after") {
				return true
			}
		}
		return false
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)), must.Func(func() string {
		return strings.Join(taskEvents(t, "llama-driver1"), "\n")
	}))
	var started string
	for _, e := range taskEvents(t, "llama-driver1") {
		if strings.Contains(e, "Starting llama_cpp engine") {
			started = e
		}
	}
	must.StrContains(t, started, "--metrics")
	must.StrContains(t, started, "-np "+fmt.Sprint(parallel))

	s := slots(t, addr)
	must.Len(t, parallel, s)
	for _, sl := range s {
		must.False(t, sl.IsProcessing)
	}

	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	code, b := post(t, "http://"+addr+"/v1/chat/completions",
		`{"model":"tiny-driver","max_tokens":5,"messages":[{"role":"user","content":"Hello from Nomad"}]}`, &out)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	resp, err := http.Get("http://" + addr + "/metrics")
	must.NoError(t, err)
	m, err := enginestats.ParseEngineMetrics(resp.Body, nil)
	resp.Body.Close()
	must.NoError(t, err)
	must.True(t, m.HasLoad)
	must.Eq(t, 0.0, m.Running)
	must.Eq(t, float64(out.Usage.CompletionTokens), m.GenTokens)

	allocs, _, err := stack.Nomad.Jobs().Allocations("llama-driver1", true, nil)
	must.NoError(t, err)
	must.Len(t, 1, allocs)
	// `nomad job stop` without -purge (the testbed's StopJob purges, which forgets the
	// allocation): wait until the client reports the allocation terminal, then read it.
	_, _, err = stack.Nomad.Jobs().Deregister("llama-driver1", false, (&nomadapi.WriteOptions{}).WithContext(ctx))
	must.NoError(t, err)
	var a *nomadapi.Allocation
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		var err error
		a, _, err = stack.Nomad.Allocations().Info(allocs[0].ID, nil)
		if err != nil {
			return err
		}
		if a.ClientTerminalStatus() {
			return nil
		}
		return fmt.Errorf("allocation %s is %s", a.ID, a.ClientStatus)
	}), wait.Timeout(60*time.Second), wait.Gap(100*time.Millisecond)))
	ts := a.TaskStates["engine"]
	must.NotNil(t, ts)
	var events []string
	exit := ""
	for _, e := range ts.Events {
		events = append(events, e.Type+": "+e.DisplayMessage)
		if e.Type == nomadapi.TaskTerminated {
			exit = e.Details["exit_code"]
		}
	}
	must.Eq(t, "dead", ts.State, must.Sprintf("%v", events))
	must.False(t, ts.Failed, must.Sprintf("%v", events))
	must.Eq(t, "0", exit, must.Sprintf("llama-server did not exit 0 on SIGTERM: %v", events))
	_, _, err = get("http://" + addr + "/health")
	must.Error(t, err, must.Sprint("llama-server still answers after the stop"))
}
