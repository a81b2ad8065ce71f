package driver

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// drainEngine serves /metrics with vLLM's gauges at the current in-flight
// count, split between running and waiting.
type drainEngine struct {
	srv      *httptest.Server
	inFlight atomic.Int64
	reads    atomic.Int64
	body     func(n int64) string
	status   int
}

func newDrainEngine(t *testing.T, n int64) *drainEngine {
	e := &drainEngine{status: http.StatusOK}
	e.inFlight.Store(n)
	e.body = func(n int64) string {
		return fmt.Sprintf("# HELP vllm:num_requests_running x\n# TYPE vllm:num_requests_running gauge\n"+
			"vllm:num_requests_running{engine=\"0\",model_name=\"m\"} %d.0\n"+
			"vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} %d.0\n", n-n/2, n/2)
	}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		e.reads.Add(1)
		w.WriteHeader(e.status)
		fmt.Fprint(w, e.body(e.inFlight.Load()))
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// drainHarness is a driver with a task on engine and its event stream.
func drainHarness(t *testing.T, engine, healthURL string) (*Driver, *taskHandle, <-chan *drivers.TaskEvent) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	logger := testLogger(t)
	d := New(ctx, logger)
	ch, err := d.TaskEvents(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Read the events as Nomad's client does, so emitting never blocks.
	events := make(chan *drivers.TaskEvent, 64)
	go func() {
		for ev := range ch {
			events <- ev
		}
	}()
	h := newHandle(logger, TaskState{
		TaskConfig: &drivers.TaskConfig{ID: "task-1", Name: "engine", AllocID: "alloc-1"},
		Engine:     engine,
		HealthURL:  healthURL,
		Remote:     engine == "openai_compat",
	})
	t.Cleanup(h.cancel)
	return d, h, events
}

func waitEvent(t *testing.T, events <-chan *drivers.TaskEvent, prefix string) *drivers.TaskEvent {
	t.Helper()
	for {
		select {
		case ev := <-events:
			if strings.HasPrefix(ev.Message, prefix) {
				return ev
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no task event %q", prefix)
		}
	}
}

func TestDrainSignalsOnceCountsReachZero(t *testing.T) {
	e := newDrainEngine(t, 3)
	d, h, events := drainHarness(t, "sim", e.srv.URL+"/health")
	const timeout = time.Hour
	done := make(chan time.Duration, 1)
	go func() { done <- d.drain(h, timeout) }()

	if ev := waitEvent(t, events, "Draining:"); ev.Message != "Draining: 3 requests in flight" {
		t.Fatalf("event %q", ev.Message)
	}
	// Still polling while requests run: several reads, no signal yet.
	for e.reads.Load() < 3 {
		select {
		case <-done:
			t.Fatal("drain returned with 3 requests in flight")
		case <-time.After(10 * time.Millisecond):
		}
	}
	e.inFlight.Store(1)
	r := e.reads.Load()
	testutil.Eventually(t, 5*time.Second, "two more reads of the engine's metrics", func() bool { return e.reads.Load() >= r+2 })
	select {
	case <-done:
		t.Fatal("drain returned with 1 request in flight")
	default:
	}
	e.inFlight.Store(0)
	left := <-done
	if left < timeout-time.Minute {
		t.Fatalf("exit grace %s: the drain should end well before the %s bound", left, timeout)
	}
	waitEvent(t, events, "Drained")
}

func TestDrainSignalsAtTheBound(t *testing.T) {
	e := newDrainEngine(t, 2)
	d, h, events := drainHarness(t, "vllm", e.srv.URL+"/health")
	const timeout = 300 * time.Millisecond
	start := time.Now()
	left := d.drain(h, timeout)
	if took := time.Since(start); took < timeout {
		t.Fatalf("drain returned after %s, before the %s bound with requests in flight", took, timeout)
	}
	// The bound used up the stop timeout; the engine still gets the floor
	// (the whole timeout when it is under drainMinExitGrace) to exit.
	if left != timeout {
		t.Fatalf("exit grace %s, want %s", left, timeout)
	}
	waitEvent(t, events, "Draining: 2 requests in flight")
	waitEvent(t, events, "Drain timeout: 2 requests still in flight")
}

func TestDrainWithoutMetricsSignalsAtOnce(t *testing.T) {
	const timeout = time.Hour
	cases := []struct {
		name   string
		engine string
		setup  func(e *drainEngine)
		reads  int64
	}{
		{"metrics 404", "sim", func(e *drainEngine) { e.status = http.StatusNotFound }, 1},
		{"no in-flight series", "vllm", func(e *drainEngine) {
			e.body = func(int64) string { return "process_cpu_seconds_total 1\n" }
		}, 1},
		{"garbage", "sglang", func(e *drainEngine) { e.body = func(int64) string { return "<html>" } }, 1},
		{"hosted endpoint", "openai_compat", func(*drainEngine) {}, 0},
		{"unknown engine", "other", func(*drainEngine) {}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newDrainEngine(t, 5)
			tc.setup(e)
			d, h, _ := drainHarness(t, tc.engine, e.srv.URL+"/health")
			if left := d.drain(h, timeout); left < timeout-time.Minute {
				t.Fatalf("exit grace %s: an engine without metrics is signalled at once", left)
			}
			if got := e.reads.Load(); got != tc.reads {
				t.Fatalf("%d metrics reads, want %d", got, tc.reads)
			}
		})
	}
	t.Run("engine not listening", func(t *testing.T) {
		e := newDrainEngine(t, 5)
		url := e.srv.URL + "/health"
		e.srv.Close()
		d, h, _ := drainHarness(t, "llama_cpp", url)
		if left := d.drain(h, timeout); left < timeout-time.Minute {
			t.Fatalf("exit grace %s: an unreachable engine is signalled at once", left)
		}
	})
}

func TestDrainEndsWhenTheEngineExits(t *testing.T) {
	e := newDrainEngine(t, 1)
	d, h, events := drainHarness(t, "sim", e.srv.URL+"/health")
	done := make(chan time.Duration, 1)
	go func() { done <- d.drain(h, time.Hour) }()
	waitEvent(t, events, "Draining: 1 requests in flight")
	h.cancel() // the task ended on its own
	if left := <-done; left < time.Hour-time.Minute {
		t.Fatalf("exit grace %s", left)
	}
}

func TestParseInFlight(t *testing.T) {
	cases := []struct {
		name  string
		names []string
		body  string
		want  int
		err   error
	}{
		{"vllm sums models and engines", []string{"vllm:num_requests_running", "vllm:num_requests_waiting"},
			"vllm:num_requests_running{model_name=\"a\"} 2\nvllm:num_requests_running{model_name=\"b\"} 1.0\n" +
				"vllm:num_requests_waiting{model_name=\"a\"} 4 1700000000000\nvllm:num_requests_running_total 99\n", 7, nil},
		{"label values with braces and escapes", []string{"vllm:num_requests_running"},
			"vllm:num_requests_running{model_name=\"x}\\\" 9\",a=\"b\"} 3\n", 3, nil},
		{"sglang", []string{"sglang:num_running_reqs", "sglang:num_queue_reqs"},
			"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name=\"m\"} 5.0\nsglang:num_queue_reqs{model_name=\"m\"} 0.0\n", 5, nil},
		{"llama.cpp", []string{"llamacpp:requests_processing", "llamacpp:requests_deferred"},
			"llamacpp:requests_processing 1\nllamacpp:requests_deferred 2\n", 3, nil},
		{"zero", []string{"vllm:num_requests_running"}, "vllm:num_requests_running 0\n", 0, nil},
		{"absent", []string{"vllm:num_requests_running"}, "other 1\n", 0, ErrNoDrainMetrics},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePromSum(strings.NewReader(tc.body), tc.names)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("got %d, %v; want %d, %v", got, err, tc.want, tc.err)
			}
		})
	}
	t.Run("trtllm", func(t *testing.T) {
		got, err := parseTRTLLMInFlight(strings.NewReader(`[{"numActiveRequests":1,"numQueuedRequests":0},{"numActiveRequests":2,"numQueuedRequests":3}]`))
		if err != nil || got != 5 {
			t.Fatalf("got %d, %v", got, err)
		}
		if got, err := parseTRTLLMInFlight(strings.NewReader(`[]`)); err != nil || got != 0 {
			t.Fatalf("empty stats: %d, %v", got, err)
		}
		if _, err := parseTRTLLMInFlight(strings.NewReader(`[{"iter":1}]`)); !errors.Is(err, ErrNoDrainMetrics) {
			t.Fatalf("stats without counts: %v", err)
		}
	})
}

func TestDrainReadIsBounded(t *testing.T) {
	// Series past drainMaxBody are never read: a runaway page cannot hold
	// the stop path.
	e := newDrainEngine(t, 0)
	pad := strings.Repeat("# padding padding padding padding padding padding padding padding\n", drainMaxBody/64+1)
	e.body = func(int64) string { return pad + "vllm:num_requests_running 4\n" }
	_, err := inFlight(context.Background(), &http.Client{Timeout: 5 * time.Second}, e.srv.URL+"/metrics",
		drainMetrics{prom: []string{"vllm:num_requests_running"}})
	if !errors.Is(err, ErrNoDrainMetrics) {
		t.Fatalf("err %v, want %v", err, ErrNoDrainMetrics)
	}
}
