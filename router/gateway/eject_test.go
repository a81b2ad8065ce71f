package gateway

import (
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"sync/atomic"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// An engine that stops accepting connections is routed around after
// EjectAfter refusals in a row (each of which cost a retry), gets one probe
// per EjectFor, and is back in rotation once a probe connects.
func TestUnreachableWorkerEjected(t *testing.T) {
	var good atomic.Int64
	ok := echoEngine(t, "good", &good)
	dead, release := testutil.RefusingAddr(t)
	const ejectFor = 300 * time.Millisecond
	h := newHarnessWith(t, Config{EjectFor: ejectFor}, nil, map[string]string{"a-dead": "m@" + dead, "b-good": "m@" + addr(ok)})
	send := func(n int) {
		t.Helper()
		for range n {
			resp := h.post("/v1/completions", `{"model":"m","prompt":"x"}`)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			must.Eq(t, http.StatusOK, resp.StatusCode)
		}
	}
	retries := func() float64 { return promtest.ToFloat64(h.m.Retries.WithLabelValues("m")) }
	ejections := func() float64 { return promtest.ToFloat64(h.m.Ejections.WithLabelValues("m")) }

	// Round robin tries a-dead first on every request (the retry's pick
	// advances it too) until it is ejected: three refusals, three retries,
	// then none.
	send(20)
	must.Eq(t, float64(DefaultEjectAfter), retries())
	must.Eq(t, 1.0, ejections())
	must.Eq(t, int64(20), good.Load())

	// After EjectFor one request probes it, is refused and retried, and the
	// worker is ejected again.
	time.Sleep(ejectFor + 50*time.Millisecond) // the input: EjectFor passes
	send(10)
	must.Eq(t, float64(DefaultEjectAfter+1), retries())
	must.Eq(t, 2.0, ejections())

	// The engine comes back on its address: the next probe connects and the
	// worker serves again.
	var back atomic.Int64
	release()
	ln, err := net.Listen("tcp", dead)
	must.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		back.Add(1)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	testutil.EventuallyEvery(t, 5*time.Second, 50*time.Millisecond, "the engine, back on its address, to serve a probe", func() bool {
		send(2)
		return back.Load() > 0
	})
	before := back.Load()
	send(10)
	must.Eq(t, before+5, back.Load()) // round robin again
	must.Eq(t, float64(DefaultEjectAfter+1), retries())
}

// Every worker ejected: requests still go to one of them rather than being
// refused outright.
func TestAllWorkersEjectedStillTried(t *testing.T) {
	h := newHarnessWith(t, Config{EjectAfter: 1, EjectFor: time.Hour}, nil, map[string]string{"a": "m@" + deadAddr(t), "b": "m@" + deadAddr(t)})
	for range 3 {
		resp := h.post("/v1/completions", `{"model":"m"}`)
		resp.Body.Close()
		must.Eq(t, http.StatusServiceUnavailable, resp.StatusCode)
	}
	must.Eq(t, 2.0, promtest.ToFloat64(h.m.Ejections.WithLabelValues("m")))
	// Each request still made two attempts (a retry), ejected or not.
	must.Eq(t, 3.0, promtest.ToFloat64(h.m.Retries.WithLabelValues("m")))
}

func TestEjectionOff(t *testing.T) {
	var good atomic.Int64
	ok := echoEngine(t, "good", &good)
	h := newHarnessWith(t, Config{EjectAfter: -1}, nil, map[string]string{"a-dead": "m@" + deadAddr(t), "b-good": "m@" + addr(ok)})
	for range 10 {
		resp := h.post("/v1/completions", `{"model":"m"}`)
		resp.Body.Close()
		must.Eq(t, http.StatusOK, resp.StatusCode)
	}
	// The retry's pick advances round robin too, so every request tries
	// a-dead first.
	must.Eq(t, 10.0, promtest.ToFloat64(h.m.Retries.WithLabelValues("m")))
	must.Eq(t, 0.0, promtest.ToFloat64(h.m.Ejections.WithLabelValues("m")))
}
