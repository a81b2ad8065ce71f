package driver

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/internal/nomadplugin/structs"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// newHarness starts the driver behind Nomad's plugin harness, configured
// like the test bed: binaries = { sim = ... }.
func newHarness(t testing.TB, binaries map[string]string) (*Driver, *driverHarness) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	d := New(ctx, testLogger(t))
	h := newDriverHarness(t.(*testing.T), d)
	t.Cleanup(h.Kill)
	if binaries == nil {
		binaries = map[string]string{"sim": os.Getenv(simBinEnv)}
	}
	var data []byte
	must.NoError(t, base.MsgPackEncode(&data, &config.PluginConfig{Binaries: binaries, FingerprintPeriod: "30s"}))
	must.NoError(t, h.SetConfig(&base.Config{PluginConfig: data, AgentConfig: &base.AgentConfig{
		Driver: &base.ClientDriverConfig{},
	}}))
	return d, h
}

type simTask struct {
	cfg      *drivers.TaskConfig
	httpPort int
	kvPort   int
	cleanup  func()
}

// newSimTask prepares a task and its alloc dir; logs makes the task's
// stdout/stderr FIFOs and copies them into alloc/logs, as Nomad's logmon
// does (only tasks that run a process have them).
func newSimTask(t testing.TB, h *driverHarness, logs bool, mutate func(*config.TaskConfig)) *simTask {
	t.Helper()
	st := &simTask{httpPort: testutil.FreePort(t), kvPort: testutil.FreePort(t)}
	allocID := newID()
	st.cfg = &drivers.TaskConfig{
		AllocID: allocID,
		ID:      newID(),
		Name:    "engine",
		Env:     map[string]string{"NVIDIA_VISIBLE_DEVICES": "GPU-test-0,GPU-test-1"},
		Resources: &drivers.Resources{
			NomadResources: &drivers.AllocatedTaskResources{MemoryMB: 256, CPUShares: 100},
			LinuxResources: &drivers.LinuxResources{MemoryLimitBytes: 256 << 20, CPUShares: 100},
			Ports: []drivers.PortMapping{
				{Label: "http", Value: st.httpPort, HostIP: "127.0.0.1"},
				{Label: "kv", Value: st.kvPort, HostIP: "127.0.0.1"},
			},
		},
	}
	tc := config.TaskConfig{Engine: "sim", Model: "meta-llama/Llama-3.1-8B-Instruct", ServedModelName: "llama",
		Port: "http", KVEventsPort: "kv"}
	if mutate != nil {
		mutate(&tc)
	}
	must.NoError(t, st.cfg.EncodeConcreteDriverConfig(&tc))
	st.cleanup = h.MkAllocDir(st.cfg, logs)
	t.Cleanup(st.cleanup)
	// A failed test must not leave its engine or supervisor running: kill
	// what this task's port identifies (after the test's own stop, if any).
	t.Cleanup(func() { killTaskProcesses(st.httpPort) })
	return st
}

// collectEvents gathers the driver's task events for one task.
type eventLog struct {
	ch   <-chan *drivers.TaskEvent
	seen []string
}

func watchEvents(t testing.TB, h *driverHarness) *eventLog {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := h.TaskEvents(ctx)
	must.NoError(t, err)
	waitSubscribed(t, h, ch)
	return &eventLog{ch: ch}
}

// waitSubscribed returns once events the driver emits reach ch: the stream
// reaches the driver's eventer after TaskEvents returns, and an event
// emitted before that has no subscriber (a Nomad client subscribes when it
// loads the plugin, long before a task starts). It emits probe events until
// one arrives; waitFor skips the probes still queued.
func waitSubscribed(t testing.TB, h *driverHarness, ch <-chan *drivers.TaskEvent) {
	t.Helper()
	d, ok := h.impl.(*Driver)
	must.True(t, ok, must.Sprint("the harness serves an llm driver"))
	probe := &drivers.TaskConfig{ID: "watch-events-probe"}
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		d.emit(probe, "probe", nil)
		select {
		case ev := <-ch:
			if ev != nil && ev.TaskID == probe.ID {
				return
			}
		case <-tick.C:
		case <-deadline:
			t.Fatal("the task event stream never reached the driver")
		}
	}
}

// waitFor returns the first event of taskID containing substr.
func (l *eventLog) waitFor(t testing.TB, taskID, substr string, timeout time.Duration) *drivers.TaskEvent {
	t.Helper()
	deadline := time.After(timeout)
	for {
		select {
		case ev := <-l.ch:
			if ev == nil {
				t.Fatalf("event stream closed while waiting for %q; seen: %q", substr, l.seen)
			}
			if ev.TaskID != taskID {
				continue
			}
			l.seen = append(l.seen, ev.Message)
			if strings.Contains(ev.Message, substr) {
				return ev
			}
		case <-deadline:
			t.Fatalf("no event %q within %s; seen: %q", substr, timeout, l.seen)
		}
	}
}

func pidOf(t testing.TB, h *driverHarness, taskID string) int {
	t.Helper()
	st, err := h.InspectTask(taskID)
	must.NoError(t, err)
	pid, err := strconv.Atoi(st.DriverAttributes["pid"])
	must.NoError(t, err)
	return pid
}

func waitHealthy(t testing.TB, port int) {
	t.Helper()
	testutil.EventuallyEvery(t, 30*time.Second, 20*time.Millisecond, "the task's /health to answer 200", func() bool {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/health", port))
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
}

// killTaskProcesses SIGKILLs the engine serving on port (its process
// group) and its supervisor (the engine's parent).
func killTaskProcesses(port int) {
	needle := []byte(fmt.Sprintf("\x00--port\x00%d\x00", port))
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(cmdline, needle) {
			continue
		}
		if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil {
			// stat: pid (comm) state ppid ...
			if f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:])); len(f) > 1 {
				if ppid, err := strconv.Atoi(f[1]); err == nil && ppid > 1 {
					_ = syscall.Kill(ppid, syscall.SIGKILL)
				}
			}
		}
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

func chat(t testing.TB, port int, model string) string {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":4}`, model)
	resp, err := http.Post(fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", port), "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	must.EqOp(t, http.StatusOK, resp.StatusCode, must.Sprint(string(b)))
	return string(b)
}

// TestDriver_StartReadyServeStop runs oasis-sim through the harness: events
// starting → loading model → ready, an OpenAI request, CUDA_VISIBLE_DEVICES
// from the reservation, its own process group, and a stop that ends it.
func TestDriver_StartReadyServeStop(t *testing.T) {
	must.NotEq(t, 0, os.Getuid(), must.Sprint("harness tests run unprivileged (TestMain re-executes as nobody)"))
	_, h := newHarness(t, nil)
	events := watchEvents(t, h)
	task := newSimTask(t, h, true, func(c *config.TaskConfig) { c.TensorParallelSize = 2 })

	_, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	events.waitFor(t, task.cfg.ID, "Starting sim engine: ", 5*time.Second)
	events.waitFor(t, task.cfg.ID, "Loading model meta-llama/Llama-3.1-8B-Instruct", 5*time.Second)
	ready := events.waitFor(t, task.cfg.ID, "Engine ready after", 30*time.Second)
	must.MapContainsKey(t, ready.Annotations, "ready_after_ms")

	must.StrContains(t, chat(t, task.httpPort, "llama"), `"choices"`)

	pid := pidOf(t, h, task.cfg.ID)
	pgid, err := syscall.Getpgid(pid)
	must.NoError(t, err)
	must.EqOp(t, pid, pgid, must.Sprint("the engine leads its own process group"))
	environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	must.NoError(t, err)
	must.StrContains(t, string(environ), "CUDA_VISIBLE_DEVICES=GPU-test-0,GPU-test-1\x00")
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	must.NoError(t, err)
	must.StrContains(t, string(cmdline), "serve\x00meta-llama/Llama-3.1-8B-Instruct\x00--host\x00127.0.0.1\x00")

	st, err := h.InspectTask(task.cfg.ID)
	must.NoError(t, err)
	must.EqOp(t, drivers.TaskStateRunning, st.State)
	must.EqOp(t, "ready", st.DriverAttributes["health"])

	waitCh, err := h.WaitTask(context.Background(), task.cfg.ID)
	must.NoError(t, err)
	must.NoError(t, h.StopTask(task.cfg.ID, 5*time.Second, "SIGTERM"))
	select {
	case res := <-waitCh:
		must.NotNil(t, res)
	case <-time.After(10 * time.Second):
		t.Fatal("WaitTask did not return after StopTask")
	}
	testutil.EventuallyEvery(t, 5*time.Second, 50*time.Millisecond, "the task's process to exit after StopTask", func() bool { return !alive(pid) })
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))
}

// TestDriver_RecoverTask: a fresh driver (a restarted Nomad client)
// reattaches to the running engine through the stored supervisor state
// without restarting it, and reports it once the client waits on the task;
// recovering a known task is a no-op.
func TestDriver_RecoverTask(t *testing.T) {
	_, h := newHarness(t, nil)
	task := newSimTask(t, h, true, nil)
	handle, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	pid := pidOf(t, h, task.cfg.ID)

	d2, h2 := newHarness(t, nil)
	must.NoError(t, h2.RecoverTask(handle))
	must.NoError(t, h2.RecoverTask(handle), must.Sprint("recovering a known task is a no-op"))
	must.EqOp(t, pid, pidOf(t, h2, task.cfg.ID))
	st, err := h2.InspectTask(task.cfg.ID)
	must.NoError(t, err)
	must.EqOp(t, drivers.TaskStateRunning, st.State)
	must.True(t, alive(pid))
	waitHealthy(t, task.httpPort)
	must.StrContains(t, chat(t, task.httpPort, "llama"), `"choices"`)
	must.EqOp(t, 1, len(d2.tasks.tasks))

	// The reattachment is reported as soon as the client waits on the task
	// (it routes the task's events by then), not after the minute's fallback.
	events := watchEvents(t, h2)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	_, err = h2.WaitTask(ctx, task.cfg.ID)
	must.NoError(t, err)
	events.waitFor(t, task.cfg.ID, fmt.Sprintf("Reattached to engine (pid %d)", pid), 10*time.Second)

	// The old driver instance goes away like a stopped client: only its
	// in-memory handle, never the engine.
	h.Kill()
	must.True(t, alive(pid))

	must.NoError(t, h2.StopTask(task.cfg.ID, 5*time.Second, "SIGINT"))
	testutil.EventuallyEvery(t, 5*time.Second, 50*time.Millisecond, "the recovered task's process to exit after StopTask", func() bool { return !alive(pid) })
	must.NoError(t, h2.DestroyTask(task.cfg.ID, true))
}

// TestDriver_RecoverTaskSupervisorGone: when the engine and its supervisor died
// while the client was down, recovery fails with an error saying so (the
// client then restarts the task).
func TestDriver_RecoverTaskSupervisorGone(t *testing.T) {
	_, h := newHarness(t, nil)
	task := newSimTask(t, h, true, nil)
	handle, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	pid := pidOf(t, h, task.cfg.ID)
	h.Kill()
	killTaskProcesses(task.httpPort)
	testutil.EventuallyEvery(t, 5*time.Second, 20*time.Millisecond, "the task's process to exit after the plugin was killed", func() bool { return !alive(pid) })

	_, h2 := newHarness(t, nil)
	err = h2.RecoverTask(handle)
	must.ErrorContains(t, err, "reattaching to the supervisor of task")
	_, err = h2.InspectTask(task.cfg.ID)
	must.ErrorContains(t, err, drivers.ErrTaskNotFound.Error())
}

// TestDriver_EngineExitEvent: an engine that dies reports its exit code and
// the last lines of its stderr in a task event.
func TestDriver_EngineExitEvent(t *testing.T) {
	_, h := newHarness(t, nil)
	events := watchEvents(t, h)
	task := newSimTask(t, h, true, func(c *config.TaskConfig) { c.ExtraArgs = []string{"--max-num-seqs", "many"} })
	_, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	waitCh, err := h.WaitTask(context.Background(), task.cfg.ID)
	must.NoError(t, err)
	select {
	case res := <-waitCh:
		must.NotEq(t, 0, res.ExitCode)
	case <-time.After(20 * time.Second):
		t.Fatal("engine with a malformed flag did not exit")
	}
	ev := events.waitFor(t, task.cfg.ID, "Engine exited with code", 10*time.Second)
	must.StrContains(t, ev.Message, "last stderr lines:")
	must.StrContains(t, ev.Message, "max-num-seqs")
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))
}

// TestDriver_BadConfigFailsBeforeStart: invalid configs are errors naming
// the field, and nothing is launched.
func TestDriver_BadConfigFailsBeforeStart(t *testing.T) {
	cases := []struct {
		name     string
		mutate   func(*config.TaskConfig)
		want     string
		binaries map[string]string
		env      map[string]string // added to the task env (job/group/task meta)
	}{
		{"port label missing", func(c *config.TaskConfig) { c.Port = "api" }, `port: port label "api" is not in the group's network block`, nil, nil},
		{"unknown engine", func(c *config.TaskConfig) { c.Engine = "tgi" }, "engine: unknown engine", nil, nil},
		{"missing model", func(c *config.TaskConfig) { c.Model = "" }, "model: is required", nil, nil},
		{"tp larger than gpus", func(c *config.TaskConfig) {
			c.Engine = "vllm"
			c.TensorParallelSize = 4
		}, "tensor_parallel_size: 4 is larger than the 2 GPU(s)", map[string]string{"vllm": os.Getenv(simBinEnv)}, nil},
		{"engine binary missing", func(c *config.TaskConfig) { c.Engine = "llama_cpp"; c.KVEventsPort = "" }, "engine: engine llama_cpp: binary \"llama-server\" not found", nil, nil},
		{"incompatible combination", func(c *config.TaskConfig) { c.KVOffload = "hicache" }, "kv_offload: \"hicache\" is not supported by engine sim", nil, nil},
		{"meta block size contradicts", nil, `job/group/task meta oasis_block_size: "32" contradicts the task's block_size ("16")`, nil,
			map[string]string{"NOMAD_META_oasis_block_size": "32", "NOMAD_META_OASIS_BLOCK_SIZE": "32"}},
		{"tier without the task's identity", func(c *config.TaskConfig) { c.KVOffloadTier = "node-kv" },
			"kv_offload_tier: the driver reads the tier with the task's workload identity, which the task does not expose", nil, nil},
		{"tier name", func(c *config.TaskConfig) { c.KVOffloadTier = "Node KV" }, `kv_offload_tier: "Node KV" is not a tier name`, nil, nil},
		{"meta model contradicts", nil, `meta oasis_model: "llama-70b" contradicts the task's served_model_name ("llama")`, nil,
			map[string]string{"NOMAD_META_OASIS_MODEL": "llama-70b"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, h := newHarness(t, tc.binaries)
			task := newSimTask(t, h, false, tc.mutate)
			maps.Copy(task.cfg.Env, tc.env)
			_, _, err := h.StartTask(task.cfg)
			must.ErrorContains(t, err, tc.want)
			_, err = h.InspectTask(task.cfg.ID)
			must.ErrorContains(t, err, drivers.ErrTaskNotFound.Error())
		})
	}
}

// TestDriver_Fingerprint publishes the sim's version and is healthy with
// one engine; with none it is undetected and says what it looked for.
func TestDriver_Fingerprint(t *testing.T) {
	_, h := newHarness(t, nil)
	fp := firstFingerprint(t, h)
	must.EqOp(t, drivers.HealthStateHealthy, fp.Health)
	v, ok := attrString(fp.Attributes["driver.llm.sim.version"])
	must.True(t, ok)
	must.EqOp(t, "0.1.0", v)

	t.Setenv("PATH", t.TempDir())
	_, h2 := newHarness(t, map[string]string{"sim": "/nonexistent/oasis-sim"})
	fp = firstFingerprint(t, h2)
	must.EqOp(t, drivers.HealthStateUndetected, fp.Health)
	must.StrContains(t, fp.HealthDescription, "no inference engine found")
}

func firstFingerprint(t *testing.T, h *driverHarness) *drivers.Fingerprint {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	ch, err := h.Fingerprint(ctx)
	must.NoError(t, err)
	select {
	case fp := <-ch:
		return fp
	case <-time.After(30 * time.Second):
		t.Fatal("no fingerprint")
	}
	return nil
}

// TestDriver_OpenAICompat runs no process: the task is running while the
// remote endpoint answers, and an unreachable endpoint fails the start.
func TestDriver_OpenAICompat(t *testing.T) {
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		w.Write([]byte(`{"object":"list","data":[]}`))
	}))
	defer remote.Close()

	_, h := newHarness(t, nil)
	task := newSimTask(t, h, false, func(c *config.TaskConfig) {
		*c = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o", Endpoint: remote.URL + "/v1"}
	})
	handle, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	st, err := h.InspectTask(task.cfg.ID)
	must.NoError(t, err)
	must.EqOp(t, drivers.TaskStateRunning, st.State)
	must.MapNotContainsKey(t, st.DriverAttributes, "pid")
	must.ErrorContains(t, h.SignalTask(task.cfg.ID, "SIGHUP"), ErrNoProcess.Error())
	// A restarted client recovers it without a process to reattach to.
	_, h2 := newHarness(t, nil)
	must.NoError(t, h2.RecoverTask(handle))
	st, err = h2.InspectTask(task.cfg.ID)
	must.NoError(t, err)
	must.EqOp(t, drivers.TaskStateRunning, st.State)
	must.NoError(t, h2.StopTask(task.cfg.ID, time.Second, "SIGTERM"))
	must.NoError(t, h2.DestroyTask(task.cfg.ID, true))

	must.NoError(t, h.StopTask(task.cfg.ID, time.Second, "SIGTERM"))
	st, err = h.InspectTask(task.cfg.ID)
	must.NoError(t, err)
	must.EqOp(t, drivers.TaskStateExited, st.State)
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))

	down := fmt.Sprintf("http://127.0.0.1:%d/v1", testutil.FreePort(t))
	task2 := newSimTask(t, h, false, func(c *config.TaskConfig) {
		*c = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o", Endpoint: down}
	})
	_, _, err = h.StartTask(task2.cfg)
	must.ErrorContains(t, err, "endpoint: openai_compat endpoint unreachable")
	// Through the wire as Nomad's client reads it: the RecoverableError
	// status detail.
	must.True(t, structs.IsRecoverable(err), must.Sprintf("%T %v", err, err))
}

// TestDriver_OpenAICompatEndpointGoesAway: three failed checks in a row end
// the task with exit code 1 and a "Health failing" event.
func TestDriver_OpenAICompatEndpointGoesAway(t *testing.T) {
	remote := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized) // reachable without the API key
	}))
	d, h := newHarness(t, nil)
	d.timing.remote = 50 * time.Millisecond
	events := watchEvents(t, h)
	task := newSimTask(t, h, false, func(c *config.TaskConfig) {
		*c = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o", Endpoint: remote.URL + "/v1"}
	})
	_, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	waitCh, err := h.WaitTask(context.Background(), task.cfg.ID)
	must.NoError(t, err)
	events.waitFor(t, task.cfg.ID, "Remote endpoint", 5*time.Second)
	remote.Close()
	select {
	case res := <-waitCh:
		must.EqOp(t, 1, res.ExitCode)
	case <-time.After(10 * time.Second):
		t.Fatal("task kept running with its endpoint gone")
	}
	events.waitFor(t, task.cfg.ID, "Health failing: remote endpoint", 5*time.Second)
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))
}

// TestDriver_StopHonoursKillTimeout: an engine that ignores the kill
// signal is SIGKILLed with its whole process group once the timeout passes.
func TestDriver_StopHonoursKillTimeout(t *testing.T) {
	script := t.TempDir() + "/stubborn-engine"
	// Ignores SIGTERM; a child keeps the process group populated.
	must.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\ntrap '' TERM\nsleep 300 &\nwhile :; do sleep 1; done\n"), 0o755))
	_, h := newHarness(t, map[string]string{"sim": script})
	task := newSimTask(t, h, true, nil)
	_, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	pid := pidOf(t, h, task.cfg.ID)
	var members []int
	testutil.EventuallyEvery(t, 5*time.Second, 20*time.Millisecond, "the task's process group to have at least two members", func() bool {
		members = groupMembers(pid)
		return len(members) >= 2
	})

	start := time.Now()
	must.NoError(t, h.StopTask(task.cfg.ID, 700*time.Millisecond, "SIGTERM"))
	must.GreaterEq(t, 700*time.Millisecond, time.Since(start), must.Sprint("SIGTERM was ignored: the kill timeout must pass first"))
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool { return len(groupMembers(pid)) == 0 }),
		wait.Timeout(5*time.Second), wait.Gap(20*time.Millisecond)),
		must.Func(func() string { return fmt.Sprintf("process group %d still has %v", pid, groupMembers(pid)) }))
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))
}

// TestDriver_StatsAndExec: CPU/memory stats come from the supervisor, and
// exec runs inside the task's environment.
func TestDriver_StatsAndExec(t *testing.T) {
	_, h := newHarness(t, nil)
	task := newSimTask(t, h, true, nil)
	_, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	waitHealthy(t, task.httpPort)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stats, err := h.TaskStats(ctx, task.cfg.ID, 100*time.Millisecond)
	must.NoError(t, err)
	select {
	case u := <-stats:
		must.NotNil(t, u)
		must.NotNil(t, u.ResourceUsage)
		must.Positive(t, u.ResourceUsage.MemoryStats.RSS)
	case <-ctx.Done():
		t.Fatal("no stats")
	}

	res, err := h.ExecTask(task.cfg.ID, []string{"/bin/sh", "-c", "echo $CUDA_VISIBLE_DEVICES"}, 5*time.Second)
	must.NoError(t, err)
	must.EqOp(t, 0, res.ExitResult.ExitCode)
	must.EqOp(t, "GPU-test-0,GPU-test-1\n", string(res.Stdout))
	must.NoError(t, h.StopTask(task.cfg.ID, 5*time.Second, "SIGINT"))
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))
}

// groupMembers lists live (non-zombie) processes in process group pgid.
func groupMembers(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if g, err := syscall.Getpgid(pid); err == nil && g == pgid {
			if stat, err := os.ReadFile("/proc/" + e.Name() + "/stat"); err == nil && !bytes.Contains(stat, []byte(") Z ")) {
				out = append(out, pid)
			}
		}
	}
	return out
}

// TestDriver_HealthFailingAndBack: a ready engine that stops answering gets
// a "Health failing" event (the task keeps running: Nomad's checks decide),
// and "Engine healthy again" when it answers again.
func TestDriver_HealthFailingAndBack(t *testing.T) {
	d, h := newHarness(t, nil)
	d.timing.steady, d.timing.probe = 50*time.Millisecond, 200*time.Millisecond
	events := watchEvents(t, h)
	task := newSimTask(t, h, true, nil)
	_, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	events.waitFor(t, task.cfg.ID, "Engine ready after", 30*time.Second)
	pid := pidOf(t, h, task.cfg.ID)

	must.NoError(t, syscall.Kill(pid, syscall.SIGSTOP))
	events.waitFor(t, task.cfg.ID, "Health failing: http://127.0.0.1:", 10*time.Second)
	st, err := h.InspectTask(task.cfg.ID)
	must.NoError(t, err)
	must.EqOp(t, drivers.TaskStateRunning, st.State)
	must.EqOp(t, "failing", st.DriverAttributes["health"])

	must.NoError(t, syscall.Kill(pid, syscall.SIGCONT))
	events.waitFor(t, task.cfg.ID, "Engine healthy again", 10*time.Second)
	must.NoError(t, h.StopTask(task.cfg.ID, 5*time.Second, "SIGTERM"))
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))
}

// TestDriver_NeverReady: an engine that never answers its health endpoint
// within health_timeout gets a "Health failing" event.
func TestDriver_NeverReady(t *testing.T) {
	script := t.TempDir() + "/silent-engine"
	must.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nexec sleep 300\n"), 0o755))
	_, h := newHarness(t, map[string]string{"sim": script})
	events := watchEvents(t, h)
	task := newSimTask(t, h, true, func(c *config.TaskConfig) { c.HealthTimeout = "300ms" })
	_, _, err := h.StartTask(task.cfg)
	must.NoError(t, err)
	ev := events.waitFor(t, task.cfg.ID, "Health failing: ", 10*time.Second)
	must.StrContains(t, ev.Message, "not ready after 300ms")
	must.NoError(t, h.StopTask(task.cfg.ID, time.Second, "SIGTERM"))
	must.NoError(t, h.DestroyTask(task.cfg.ID, true))
}

// TestDriver_FingerprintEngines: each engine's version command is run the
// way the real one answers (stand-in scripts: no real engine can run here);
// one that fails is not advertised.
func TestDriver_FingerprintEngines(t *testing.T) {
	dir := t.TempDir()
	script := func(name, body string) string {
		path := dir + "/" + name
		must.NoError(t, os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755))
		return path
	}
	bins := map[string]string{
		"vllm":      script("vllm", `[ "$1" = --version ] && echo 0.11.2`),
		"sglang":    script("python3", `[ "$1" = -c ] && [ "$2" = "import sglang; print(sglang.__version__)" ] && echo 0.5.4.post1`),
		"llama_cpp": script("llama-server", `[ "$1" = --version ] && printf 'version: 6123 (abc1234)\nbuilt with cc\n' >&2`),
		"trtllm":    script("trtllm-serve", `echo "no such option" >&2; exit 2`),
		"sim":       os.Getenv(simBinEnv),
	}
	_, h := newHarness(t, bins)
	fp := firstFingerprint(t, h)
	must.EqOp(t, drivers.HealthStateHealthy, fp.Health)
	for attr, want := range map[string]string{
		"driver.llm.vllm.version":      "0.11.2",
		"driver.llm.sglang.version":    "0.5.4.post1",
		"driver.llm.llama_cpp.version": "6123",
		"driver.llm.sim.version":       "0.1.0",
	} {
		got, ok := attrString(fp.Attributes[attr])
		must.True(t, ok, must.Sprint(attr))
		must.EqOp(t, want, got, must.Sprint(attr))
	}
	must.MapNotContainsKey(t, fp.Attributes, "driver.llm.trtllm.version")
	must.StrContains(t, fp.HealthDescription, "engines: llama_cpp 6123, sglang 0.5.4.post1, sim 0.1.0, vllm 0.11.2")
}

// TestDriver_SimAcceptsEveryRendering starts oasis-sim (whose command line
// parser validates vLLM's flags) with every kv_offload × role the matrix
// allows for vllm/sim, and waits until each is ready.
func TestDriver_SimAcceptsEveryRendering(t *testing.T) {
	for _, o := range config.Offloads {
		for _, r := range config.Roles {
			if !config.Supported(config.EngineSim, o, r) {
				continue
			}
			t.Run(o+"-"+r, func(t *testing.T) {
				// One harness per task: the alloc dir's cleanup closes it.
				_, h := newHarness(t, nil)
				events := watchEvents(t, h)
				task := newSimTask(t, h, false, func(c *config.TaskConfig) {
					c.KVOffload, c.Role = o, r
					switch o {
					case config.OffloadNative, config.OffloadLMCache, config.OffloadKVBM, config.OffloadKVCached, config.OffloadFlexKV:
						c.KVOffloadSizeGB = 1
					}
					if r != config.RoleBoth {
						c.NIXLSideChannelPort = "nixl"
					}
				})
				nixl := testutil.FreePort(t)
				task.cfg.Resources.Ports = append(task.cfg.Resources.Ports,
					drivers.PortMapping{Label: "nixl", Value: nixl, HostIP: "127.0.0.1"})
				_, _, err := h.StartTask(task.cfg)
				must.NoError(t, err)
				events.waitFor(t, task.cfg.ID, "Engine ready after", 30*time.Second)
				pid := pidOf(t, h, task.cfg.ID)
				environ, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
				must.NoError(t, err)
				if r != config.RoleBoth {
					must.StrContains(t, string(environ), fmt.Sprintf("\x00VLLM_NIXL_SIDE_CHANNEL_PORT=%d\x00", nixl))
				}
				if o == config.OffloadLMCache || o == config.OffloadKVCached {
					yaml, err := os.ReadFile(task.cfg.TaskDir().LocalDir + "/lmcache.yaml")
					must.NoError(t, err)
					must.StrContains(t, string(yaml), "pre_caching_hash_algorithm: sha256_cbor")
					must.StrContains(t, string(environ), "LMCACHE_CONFIG_FILE="+task.cfg.TaskDir().LocalDir+"/lmcache.yaml\x00")
				}
				must.NoError(t, h.StopTask(task.cfg.ID, 5*time.Second, "SIGTERM"))
				must.NoError(t, h.DestroyTask(task.cfg.ID, true))
			})
		}
	}
}

// attrString is a string attribute's value; false when a is not one.
func attrString(a *structs.Attribute) (string, bool) {
	if a == nil || a.String == nil {
		return "", false
	}
	return *a.String, true
}
