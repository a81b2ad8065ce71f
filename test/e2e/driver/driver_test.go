// Package driver tests the llm task driver on the real Nomad + Consul test
// bed: a job with driver = "llm", engine = "sim" runs, registers the
// oasis-engine service with the documented meta in Consul, answers OpenAI
// requests, survives a Nomad agent restart untouched, and stops cleanly;
// invalid configs fail with the field named.
package driver

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }

// simJob is the reference job: the engine service follows the Oasis
// convention (name oasis-engine, tags, oasis_* meta).
func simJob(id, extraConfig string) string {
	return testbed.SimEngine{ID: id, KVEvents: true, Config: extraConfig}.HCL()
}

func runningAlloc(t *testing.T, ctx context.Context, jobID string) *nomadapi.Allocation {
	t.Helper()
	allocs, err := stack.WaitAllocsRunning(ctx, jobID)
	must.NoError(t, err)
	must.Len(t, 1, allocs)
	alloc, _, err := stack.Nomad.Allocations().Info(allocs[0].ID, nil)
	must.NoError(t, err)
	return alloc
}

func allocPort(t *testing.T, alloc *nomadapi.Allocation, label string) (string, int) {
	t.Helper()
	for _, p := range alloc.AllocatedResources.Shared.Ports {
		if p.Label == label {
			return p.HostIP, p.Value
		}
	}
	t.Fatalf("allocation has no port %q", label)
	return "", 0
}

// enginePID finds the engine by its rendered --port argument.
func enginePID(t *testing.T, port int) int {
	t.Helper()
	var pid int
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, fmt.Sprintf("an engine process listening on port %d", port), func() bool {
		pid = findProcess(fmt.Sprintf("\x00--port\x00%d\x00", port))
		return pid != 0
	})
	return pid
}

func findProcess(needle string) int {
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(needle)) && bytes.Contains(cmdline, []byte("oasis-sim\x00serve\x00")) {
			return pid
		}
	}
	return 0
}

// groupMembers lists live processes in process group pgid.
func groupMembers(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && !bytes.Contains(stat, []byte(") Z ")) {
				out = append(out, pid)
			}
		}
	}
	return out
}

func chat(t *testing.T, addr string) string {
	t.Helper()
	return chatPrompt(t, addr, "Say hello")
}

func chatPrompt(t *testing.T, addr, prompt string) string {
	t.Helper()
	body := fmt.Sprintf(`{"model":"llama","messages":[{"role":"user","content":%q}],"max_tokens":8}`, prompt)
	resp, err := http.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	must.EqOp(t, http.StatusOK, resp.StatusCode, must.Sprint(string(b)))
	must.StrContains(t, string(b), `"choices"`)
	return string(b)
}

func taskEvents(t testing.TB, allocID string) []*nomadapi.TaskEvent {
	t.Helper()
	alloc, _, err := stack.Nomad.Allocations().Info(allocID, nil)
	must.NoError(t, err)
	st := alloc.TaskStates["engine"]
	if st == nil {
		return nil
	}
	return st.Events
}

// waitEvent waits for a task event. The bound is generous: after an agent restart the client
// re-attaches a task only once it is registered with the server again, which here has taken
// up to ~20 s (the restarted server's keyring answers "Permission denied" until then).
func waitEvent(t testing.TB, allocID, substr string) *nomadapi.TaskEvent {
	t.Helper()
	var found *nomadapi.TaskEvent
	var seen []string
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		seen = seen[:0]
		for _, e := range taskEvents(t, allocID) {
			msg := e.DisplayMessage + " " + e.DriverMessage + " " + e.DriverError
			seen = append(seen, e.Type+": "+msg)
			if strings.Contains(msg, substr) {
				found = e
				return true
			}
		}
		return false
	}), wait.Timeout(90*time.Second), wait.Gap(100*time.Millisecond)), must.Func(func() string {
		return fmt.Sprintf("no task event containing %q; events: %q", substr, seen)
	}))
	return found
}

// TestSimJob_RunsRegistersServesRestartsStops is the driver's life cycle on
// a real agent, in order: run, Consul registration with the convention's
// meta, an OpenAI request, a Nomad agent restart that leaves the engine
// untouched, then a stop that ends the engine's whole process group.
func TestSimJob_RunsRegistersServesRestartsStops(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	node, _, err := stack.Nomad.Nodes().Info(stack.NodeID, nil)
	must.NoError(t, err)
	must.True(t, node.Drivers["llm"].Healthy, must.Sprint(node.Drivers["llm"].HealthDescription))
	must.EqOp(t, "0.1.0", node.Attributes["driver.llm.sim.version"])

	const jobID = "oasis-driver-sim"
	_, err = stack.RunJobHCL(ctx, simJob(jobID, ""))
	must.NoError(t, err)
	alloc := runningAlloc(t, ctx, jobID)
	host, port := allocPort(t, alloc, "http")
	kvHost, kvPort := allocPort(t, alloc, "kv")
	addr := net.JoinHostPort(host, strconv.Itoa(port))

	waitEvent(t, alloc.ID, "Starting sim engine: ")
	waitEvent(t, alloc.ID, "Loading model meta-llama/Llama-3.1-8B-Instruct")
	waitEvent(t, alloc.ID, "Engine ready after")

	// Consul: a passing oasis-engine instance with the documented meta.
	var entries []*consulapi.ServiceEntry
	testutil.EventuallyEvery(t, 60*time.Second, 250*time.Millisecond, "one passing oasis-engine instance tagged engine-sim in Consul", func() bool {
		entries, _, err = stack.Consul.Health().Service("oasis-engine", "engine-sim", true, nil)
		return err == nil && len(entries) == 1
	})
	svc := entries[0].Service
	must.EqOp(t, port, svc.Port)
	must.SliceContainsAll(t, []string{"oasis", "engine-sim", "role-both"}, svc.Tags)
	meta := map[string]string{}
	for k, v := range svc.Meta {
		if strings.HasPrefix(k, "oasis_") {
			meta[k] = v
		}
	}
	must.Eq(t, map[string]string{
		"oasis_model":        "llama",
		"oasis_engine":       "sim",
		"oasis_role":         "both",
		"oasis_kv_events":    fmt.Sprintf("tcp://%s:%d", kvHost, kvPort),
		"oasis_metrics_path": "/metrics",
		"oasis_block_size":   "16",
		"oasis_node":         stack.NodeID,
	}, meta)

	// The rendered --kv-events-config publishes where oasis_kv_events says:
	// a long prompt fills 16-token blocks and the engine reports them.
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: svc.Meta["oasis_kv_events"]})
	must.NoError(t, err)
	defer sub.Close()
	go sub.Run(ctx)
	// ZMQ slow joiner: what the engine publishes before the SUB has
	// connected is lost, so send a fresh prompt (new blocks, not a cache
	// hit) until one's batch arrives, as router/cachestate's publishUntil
	// does.
	engineAddr := net.JoinHostPort(svc.Address, strconv.Itoa(svc.Port))
	var stored *kvevents.BlockStored
	attempt := 0
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "a BlockStored batch from "+svc.Meta["oasis_kv_events"], func() bool {
		attempt++
		chatPrompt(t, engineAddr, fmt.Sprintf("Attempt %d. ", attempt)+strings.Repeat("The quick brown fox jumps over the lazy dog. ", 20))
		for stored == nil {
			nctx, ncancel := context.WithTimeout(ctx, time.Second)
			msg, err := sub.Next(nctx)
			ncancel()
			if err != nil {
				return false // nothing for this prompt: send another
			}
			for _, ev := range msg.Batch.Events {
				if bs, ok := ev.(kvevents.BlockStored); ok {
					stored = &bs
				}
			}
		}
		return true
	})
	t.Logf("first BlockStored batch after %d prompt(s)", attempt)
	must.EqOp(t, 16, stored.BlockSize)
	must.Positive(t, len(stored.BlockHashes))

	pid := enginePID(t, port)
	pgid, err := syscall.Getpgid(pid)
	must.NoError(t, err)
	must.EqOp(t, pid, pgid, must.Sprint("the engine leads its own process group"))

	// Restarting the agent reattaches: same PID, task still running, no restart.
	must.NoError(t, stack.RestartNomad(ctx))
	waitEvent(t, alloc.ID, fmt.Sprintf("Reattached to engine (pid %d)", pid))
	alloc = runningAlloc(t, ctx, jobID)
	must.EqOp(t, "running", alloc.TaskStates["engine"].State)
	must.EqOp(t, uint64(0), alloc.TaskStates["engine"].Restarts)
	must.EqOp(t, pid, enginePID(t, port))
	chat(t, addr)

	// Stopping the job ends the whole process group.
	must.NoError(t, stack.StopJob(ctx, jobID))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return len(groupMembers(pgid)) == 0 }),
		wait.Timeout(15*time.Second), wait.Gap(100*time.Millisecond)),
		must.Func(func() string { return fmt.Sprintf("process group %d still has %v", pgid, groupMembers(pgid)) }))
	testutil.EventuallyEvery(t, 30*time.Second, 250*time.Millisecond, "the engine-sim instance to leave Consul", func() bool {
		entries, _, err = stack.Consul.Health().Service("oasis-engine", "engine-sim", false, nil)
		return err == nil && len(entries) == 0
	})
}

// TestInvalidConfig_FailsWithFieldNamed: Nomad's servers do not know a
// driver's schema (validate and plan accept any driver config), so the
// first place an llm config can be checked is the client. Type errors fail
// there against the hclspec schema; semantic errors fail in StartTask,
// before anything is launched; both are unrecoverable (no restart) and the
// allocation's task event names the field.
func TestInvalidConfig_FailsWithFieldNamed(t *testing.T) {
	cases := []struct {
		name, config, want, key string
	}{
		{"unknown engine", `engine = "tgi"`, "engine: unknown engine \"tgi\"; allowed: vllm, sglang, llama_cpp, trtllm, openai_compat, sim", "engine: "},
		{"port label missing", `port = "api"`, "port: port label \"api\" is not in the group's network block; labels: http, kv", "port: "},
		{"incompatible offload", `kv_offload = "hicache"`, "kv_offload: \"hicache\" is not supported by engine sim", "kv_offload: "},
		{"missing model", `model = ""`, "model: is required", "model: "},
		{"wrong type", `tensor_parallel_size = "two"`, "tensor_parallel_size", "tensor_parallel_size: wrong type"},
		{"unknown field", `tensor_parallelism = 2`, "tensor_parallelism", "tensor_parallelism: unknown field"},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			jobID := fmt.Sprintf("oasis-driver-invalid-%d", i)
			hcl := strings.Replace(simJob(jobID, ""), "\n      config {\n", "\n      config {\n        "+tc.config+"\n", 1)
			// A field set twice is an HCL error: drop the default line the case overrides.
			key := strings.Fields(tc.config)[0]
			lines := strings.Split(hcl, "\n")
			for j, l := range lines {
				if f := strings.Fields(l); len(f) > 2 && f[0] == key && f[1] == "=" && strings.TrimSpace(l) != tc.config && strings.HasPrefix(l, "        ") && !strings.HasPrefix(l, "         ") {
					lines[j] = ""
				}
			}
			hcl = strings.Join(lines, "\n")
			job, err := stack.ParseJobHCL(hcl)
			must.NoError(t, err)
			resp, _, err := stack.Nomad.Jobs().Validate(job, nil)
			must.NoError(t, err)
			must.SliceEmpty(t, resp.ValidationErrors, must.Sprint("the server cannot check driver configs"))

			// The pre-flight does: same validation as StartTask, nothing runs.
			jobFile := filepath.Join(t.TempDir(), "job.hcl")
			must.NoError(t, os.WriteFile(jobFile, []byte(hcl), 0o644))
			validate := exec.Command(stack.Bin("nomad-driver-llm"), "validate", "-address", stack.NomadAddr, jobFile)
			validate.Env = stack.Env() // NOMAD_TOKEN, as an operator's shell has it
			out, err := validate.CombinedOutput()
			var ee *exec.ExitError
			must.ErrorAs(t, err, &ee, must.Sprint(string(out)))
			must.EqOp(t, 1, ee.ExitCode())
			must.StrContains(t, string(out), `group "engine" task "engine": `)
			must.StrContains(t, string(out), tc.key)

			_, _, err = stack.Nomad.Jobs().Register(job, nil)
			must.NoError(t, err)
			t.Cleanup(func() { _ = stack.StopJob(context.Background(), jobID) })
			allocs, err := stack.WaitJobDone(ctx, jobID)
			must.NoError(t, err)
			must.Len(t, 1, allocs)
			must.EqOp(t, "failed", allocs[0].ClientStatus)
			ev := waitEvent(t, allocs[0].ID, tc.want)
			must.EqOp(t, uint64(0), allocs[0].TaskStates["engine"].Restarts)
			t.Logf("%s: %s", ev.Type, ev.DisplayMessage)
		})
	}
}

// pdJob is a disaggregated pair: a prefill and a decode engine, each with
// its NIXL side-channel port, registered with their roles.
func pdJob(id string) string {
	group := func(role string) string {
		return fmt.Sprintf(`
  group %[1]q {
    network {
      port "http" {}
      port "kv" {}
      port "nixl" {}
    }
    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-sim", "role-%[1]s", %[2]q]
      meta {
        oasis_model        = "llama"
        oasis_engine       = "sim"
        oasis_role         = %[1]q
        oasis_kv_events    = "tcp://${NOMAD_ADDR_kv}"
        oasis_metrics_path = "/metrics"
        oasis_block_size   = "16"
        oasis_node         = "${node.unique.id}"
      }
      check {
        type     = "http"
        path     = "/health"
        interval = "1s"
        timeout  = "1s"
      }
    }
    task "engine" {
      driver = "llm"
      config {
        engine                 = "sim"
        model                  = "meta-llama/Llama-3.1-8B-Instruct"
        served_model_name      = "llama"
        role                   = %[1]q
        port                   = "http"
        kv_events_port         = "kv"
        nixl_side_channel_port = "nixl"
        kv_offload             = "native"
        kv_offload_size_gb     = 1
      }
      resources {
        cpu    = 200
        memory = 256
      }
    }
  }`, role, id)
	}
	return fmt.Sprintf("job %q {\n  datacenters = [\"*\"]\n%s\n%s\n}\n", id, group("prefill"), group("decode"))
}

// TestDisaggregatedSimPair runs a prefill and a decode engine rendered
// with NIXL (+ native offload stacked in a MultiConnector) and drives one
// request through both legs as a disaggregating proxy would (vLLM's protocol).
func TestDisaggregatedSimPair(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const jobID = "oasis-driver-pd"
	_, err := stack.RunJobHCL(ctx, pdJob(jobID))
	must.NoError(t, err)
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), jobID) })
	allocs, err := stack.WaitAllocsRunning(ctx, jobID)
	must.NoError(t, err)
	must.Len(t, 2, allocs)

	addr := map[string]string{}
	testutil.EventuallyEvery(t, 60*time.Second, 250*time.Millisecond, "two passing oasis-engine instances with their addresses", func() bool {
		entries, _, err := stack.Consul.Health().Service("oasis-engine", jobID, true, nil)
		if err != nil || len(entries) != 2 {
			return false
		}
		for _, e := range entries {
			addr[e.Service.Meta["oasis_role"]] = net.JoinHostPort(e.Service.Address, strconv.Itoa(e.Service.Port))
		}
		return true
	})
	must.MapContainsKeys(t, addr, []string{"prefill", "decode"})

	for _, a := range allocs {
		alloc, _, err := stack.Nomad.Allocations().Info(a.ID, nil)
		must.NoError(t, err)
		_, port := allocPort(t, alloc, "http")
		_, nixl := allocPort(t, alloc, "nixl")
		pid := enginePID(t, port)
		environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		must.NoError(t, err)
		must.StrContains(t, string(environ), fmt.Sprintf("\x00VLLM_NIXL_SIDE_CHANNEL_PORT=%d\x00", nixl))
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		must.NoError(t, err)
		must.StrContains(t, string(cmdline), `"kv_connector":"MultiConnector"`)
	}

	post := func(addr, body string) map[string]any {
		resp, err := http.Post("http://"+addr+"/v1/completions", "application/json", strings.NewReader(body))
		must.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		must.EqOp(t, http.StatusOK, resp.StatusCode, must.Sprint(string(b)))
		var out map[string]any
		must.NoError(t, json.Unmarshal(b, &out))
		return out
	}
	prompt := strings.Repeat("disaggregated serving moves the prefill elsewhere. ", 8)
	pre := post(addr["prefill"], fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":1,"stream":false,
		"kv_transfer_params":{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}}`, prompt))
	params, ok := pre["kv_transfer_params"].(map[string]any)
	must.True(t, ok, must.Sprintf("prefill answered without kv_transfer_params: %v", pre))
	must.Eq(t, true, params["do_remote_prefill"])
	paramsJSON, err := json.Marshal(params)
	must.NoError(t, err)
	dec := post(addr["decode"], fmt.Sprintf(`{"model":"llama","prompt":%q,"max_tokens":4,"kv_transfer_params":%s}`, prompt, paramsJSON))
	must.SliceNotEmpty(t, dec["choices"].([]any))
	// The decode engine pulled the prompt's KV over the side channel the driver rendered
	// (VLLM_NIXL_SIDE_CHANNEL_HOST/PORT): no local prefill.
	usage := dec["usage"].(map[string]any)
	must.Eq(t, usage["prompt_tokens"].(float64), metricValue(t, addr["decode"], `oasis_sim_prompt_tokens_total{engine="0",model_name="llama",source="remote"}`))
	must.Eq(t, 0, metricValue(t, addr["decode"], `oasis_sim_prompt_tokens_total{engine="0",model_name="llama",source="local"}`))
}

// metricValue reads one sample (name with its labels, as exposed) from an engine's /metrics.
func metricValue(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			must.NoError(t, err)
			return f
		}
	}
	t.Fatalf("%s not in %s/metrics", series, addr)
	return 0
}
