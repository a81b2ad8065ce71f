package faults

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// engine is one oasis-sim job of a test, as Nomad, Consul and the router
// name it.
type engine struct {
	job     string
	allocID string
	port    int
	pid     int // the oasis-sim process the llm driver started
}

// simArgs slow the simulator to about a real GPU's pace (a fixed step time,
// a cost per prompt token), so that a fault lands while requests are queued,
// prefilling, held before their first token and streaming.
const simArgs = `extra_args = ["--step-time-base", "40ms", "--step-time-per-prefill-token", "500us"]`

// startEngines runs n oasis-sim jobs serving model and waits until all n are
// passing in Consul. The jobs are stopped when the test ends.
func startEngines(t *testing.T, ctx context.Context, model string, n int) []*engine {
	t.Helper()
	engines := make([]*engine, n)
	for i := range engines {
		engines[i] = &engine{job: fmt.Sprintf("%s-%c", model, 'a'+i)}
		_, err := stack.RunJobHCL(ctx, testbed.SimEngine{ID: engines[i].job, Model: model, Config: simArgs}.HCL())
		must.NoError(t, err)
	}
	t.Cleanup(func() { stopEngines(t, model, engines) })
	for _, e := range engines {
		allocs, err := stack.WaitAllocsRunning(ctx, e.job)
		must.NoError(t, err)
		must.Len(t, 1, allocs)
		e.allocID = allocs[0].ID
		alloc, _, err := stack.Nomad.Allocations().Info(e.allocID, nil)
		must.NoError(t, err)
		for _, p := range alloc.AllocatedResources.Shared.Ports {
			if p.Label == "http" {
				e.port = p.Value
			}
		}
		must.Positive(t, e.port, must.Sprint("allocation of ", e.job, " has no http port"))
		e.pid = enginePID(t, e.port)
	}
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "n passing instances of the model in Consul", func() bool {
		return len(viewConsul(t, model).passing) == n
	})
	return engines
}

// stopEngines stops the engines' jobs and waits until Consul lists none of
// model's instances and their processes are gone, so that no test after
// this one meets them.
func stopEngines(t *testing.T, model string, engines []*engine) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, e := range engines {
		if err := stack.StopJob(ctx, e.job); err != nil {
			t.Errorf("stopping %s: %v", e.job, err)
		}
	}
	err := wait.InitialSuccess(wait.ErrorFunc(func() error {
		entries, _, err := stack.Consul.Health().Service("oasis-engine", "", false, nil)
		if err != nil {
			return err
		}
		for _, en := range entries {
			if en.Service.Meta["oasis_model"] == model {
				return fmt.Errorf("%s still registered in Consul", en.Service.ID)
			}
		}
		for _, e := range engines {
			if e.port != 0 && findEngine(e.port) != 0 {
				return fmt.Errorf("the engine of %s still runs", e.job)
			}
		}
		return nil
	}), wait.Timeout(time.Minute), wait.Gap(100*time.Millisecond)).Run()
	if err != nil {
		t.Errorf("after stopping the engines: %v", err)
	}
}

// enginePID finds the oasis-sim this stack's driver started on port: the
// rendered command line names the stack's binary and the port.
func enginePID(t *testing.T, port int) int {
	t.Helper()
	var pid int
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the engine process on its port", func() bool {
		pid = findEngine(port)
		return pid != 0
	})
	return pid
}

func findEngine(port int) int {
	prefix := []byte(stack.Bin("oasis-sim") + "\x00serve\x00")
	needle := []byte(fmt.Sprintf("\x00--port\x00%d\x00", port))
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.HasPrefix(cmdline, prefix) && bytes.Contains(cmdline, needle) && !zombie(pid) {
			return pid
		}
	}
	return 0
}

// zombie reports whether pid has exited without being reaped (nothing reaps
// orphans here).
func zombie(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return err != nil || bytes.Contains(stat, []byte(") Z "))
}

// consulView is what Consul says about a model's engine instances.
type consulView struct {
	registered []string          // service ids
	passing    []string          // service ids whose checks all pass
	failing    map[string]string // service id → output of its checks that do not pass
}

// viewConsul reads model's instances from Consul; a failed query is an
// empty view, logged.
func viewConsul(t *testing.T, model string) consulView {
	v := consulView{failing: map[string]string{}}
	entries, _, err := stack.Consul.Health().Service("oasis-engine", "", false, nil)
	if err != nil {
		t.Logf("consul health: %v", err)
		return v
	}
	for _, e := range entries {
		if e.Service.Meta["oasis_model"] != model {
			continue
		}
		v.registered = append(v.registered, e.Service.ID)
		if st := e.Checks.AggregatedStatus(); st == consulapi.HealthPassing {
			v.passing = append(v.passing, e.Service.ID)
			continue
		}
		var out []string
		for _, c := range e.Checks {
			if c.Status != consulapi.HealthPassing {
				out = append(out, c.Status+": "+strings.TrimSpace(c.Output))
			}
		}
		v.failing[e.Service.ID] = strings.Join(out, "; ")
	}
	return v
}

// routerProc is the oasis-router binary under test.
type routerProc struct {
	url  string
	done chan struct{}
	log  string
}

// startRouter writes policy to Consul KV under a prefix of the test's own,
// runs the router against the stack's Consul and waits until it routes model
// to n workers under that policy.
func startRouter(t *testing.T, model, policy string, n int) *routerProc {
	t.Helper()
	prefix := "oasis-faults/" + strings.ReplaceAll(t.Name(), "/", "-")
	_, err := stack.Consul.KV().Put(&consulapi.KVPair{Key: prefix + "/policy", Value: []byte(policy)}, nil)
	must.NoError(t, err)
	t.Cleanup(func() { _, _ = stack.Consul.KV().DeleteTree(prefix, nil) })
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	listen := "127.0.0.1:" + strconv.Itoa(ports[0])
	r := &routerProc{url: "http://" + listen, done: make(chan struct{}), log: filepath.Join(t.TempDir(), "router.log")}
	logf, err := os.Create(r.log)
	must.NoError(t, err)
	cmd := exec.Command(stack.Bin("oasis-router"), "-listen", listen, "-consul-addr", stack.ConsulAddr,
		"-kv-prefix", prefix, "-scrape-interval", "500ms", "-log-level", "warn")
	// The management tokens: the test keeps its policy under a KV prefix of its own, outside
	// the oasis-router role's.
	cmd.Env = stack.Env()
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must.NoError(t, cmd.Start())
	go func() { _ = cmd.Wait(); logf.Close(); close(r.done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			out, _ := os.ReadFile(r.log)
			t.Logf("router log:\n%s", out)
		}
	})
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the router to see n workers and load its policy", func() bool {
		m, err := r.metrics()
		return err == nil && m.value("oasis_router_workers", "model="+model) == float64(n) &&
			m.value("oasis_router_policy_reloads_total", "") >= 1
	})
	return r
}

// metricSet is a scrape of the router: family → label set ("k=v,k=v") → value.
type metricSet map[string]map[string]float64

func (r *routerProc) metrics() (metricSet, error) {
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, err
	}
	out := metricSet{}
	for name, f := range fams {
		out[name] = map[string]float64{}
		for _, m := range f.Metric {
			var parts []string
			for _, l := range m.Label {
				parts = append(parts, l.GetName()+"="+l.GetValue())
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[name][strings.Join(parts, ",")] = v
		}
	}
	return out, nil
}

// value is the family's value for the exact label set.
func (m metricSet) value(family, labels string) float64 { return m[family][labels] }

// sum adds the family's values whose label sets contain every one of parts.
func (m metricSet) sum(family string, parts ...string) float64 {
	total := 0.0
	for labels, v := range m[family] {
		match := true
		for _, p := range parts {
			match = match && strings.Contains(labels, p)
		}
		if match {
			total += v
		}
	}
	return total
}

// mustMetrics scrapes the router or fails the test.
func (r *routerProc) mustMetrics(t *testing.T) metricSet {
	t.Helper()
	m, err := r.metrics()
	must.NoError(t, err)
	return m
}

// poolSample is what Consul and the router said about a model's engines at
// one moment.
type poolSample struct {
	at     time.Time
	consul consulView
	routed int // the router's workers gauge for the model (-1: no answer)
}

// passes reports whether Consul listed the allocation's instance as passing.
func (s poolSample) passes(allocID string) bool {
	for _, id := range s.consul.passing {
		if strings.Contains(id, allocID) {
			return true
		}
	}
	return false
}

// poolWatch samples Consul and the router every 50 ms until stopped, so a
// test can say when an engine left either, or that none ever did.
type poolWatch struct {
	stopCh chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	samples []poolSample
}

func watchPool(t *testing.T, r *routerProc, model string) *poolWatch {
	w := &poolWatch{stopCh: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for {
			s := poolSample{at: time.Now(), consul: viewConsul(t, model), routed: -1}
			if m, err := r.metrics(); err == nil {
				s.routed = int(m.value("oasis_router_workers", "model="+model))
			}
			w.mu.Lock()
			w.samples = append(w.samples, s)
			w.mu.Unlock()
			select {
			case <-w.stopCh:
				return
			case <-tick.C:
			}
		}
	}()
	t.Cleanup(func() { w.stop() })
	return w
}

// stop ends the sampling and returns the samples.
func (w *poolWatch) stop() []poolSample {
	select {
	case <-w.stopCh:
	default:
		close(w.stopCh)
	}
	<-w.done
	return w.snapshot()
}

func (w *poolWatch) snapshot() []poolSample {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]poolSample(nil), w.samples...)
}

// waitUntil waits for a sample that satisfies cond and returns it.
func (w *poolWatch) waitUntil(t *testing.T, what string, timeout time.Duration, cond func(poolSample) bool) poolSample {
	t.Helper()
	var found poolSample
	testutil.EventuallyEvery(t, timeout, 20*time.Millisecond, what, func() bool {
		for _, s := range w.snapshot() {
			if cond(s) {
				found = s
				return true
			}
		}
		return false
	})
	return found
}
