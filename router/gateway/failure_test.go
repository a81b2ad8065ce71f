package gateway

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// These tests pin how engine failures reach the client: retried on another
// worker while nothing was sent, an SSE error event and a proper end of the
// body after; timeouts instead of requests held until the client gives up.

const roleChunk = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n"

func tokenChunk(s string) string {
	return fmt.Sprintf("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":%q},\"finish_reason\":null}]}\n\n", s)
}

// sseEngineFunc serves streams written by script, which gets the response
// writer already set up for an event stream.
func sseEngineFunc(t testing.TB, script func(w http.ResponseWriter, r *http.Request, send func(string))) *httptest.Server {
	t.Helper()
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		send := func(s string) {
			_, _ = io.WriteString(w, s)
			w.(http.Flusher).Flush()
		}
		script(w, r, send)
	}))
	t.Cleanup(e.Close)
	return e
}

// crash cuts the engine's connection, as a killed engine process would.
func crash(w http.ResponseWriter) {
	if c, _, err := http.NewResponseController(w).Hijack(); err == nil {
		c.Close()
	}
}

// freeze blocks like a SIGSTOPped engine until the router gives up on it.
func freeze(r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-time.After(10 * time.Second):
	}
}

// goodEngine streams a role chunk, two tokens and [DONE].
func goodEngine(t testing.TB, hits *atomic.Int64) *httptest.Server {
	return sseEngineFunc(t, func(_ http.ResponseWriter, _ *http.Request, send func(string)) {
		hits.Add(1)
		send(roleChunk)
		send(tokenChunk("he") + tokenChunk("llo"))
		send("data: [DONE]\n\n")
	})
}

func timeouts(header, idle, hold string) *policy.Document {
	return &policy.Document{Policy: scoring.RoundRobin,
		Timeouts: &policy.Timeouts{ResponseHeader: &header, StreamIdle: &idle, FirstTokenHold: &hold}}
}

func readAllString(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err, must.Sprint("the body must end properly"))
	return string(b)
}

func TestFailureBeforeFirstTokenIsRetried(t *testing.T) {
	cases := []struct {
		name   string
		script func(http.ResponseWriter, *http.Request, func(string))
		phase  string // UpstreamTimeouts phase counted, if any
	}{
		{"crash during prefill", func(w http.ResponseWriter, _ *http.Request, send func(string)) {
			send(roleChunk)
			crash(w)
		}, ""},
		{"frozen before the head", func(_ http.ResponseWriter, r *http.Request, _ func(string)) {
			freeze(r)
		}, "response_header"},
		{"frozen after the role chunk", func(_ http.ResponseWriter, r *http.Request, send func(string)) {
			send(roleChunk)
			freeze(r)
		}, "stream_idle"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var good atomic.Int64
			bad := sseEngineFunc(t, tc.script)
			ok := goodEngine(t, &good)
			// Timeouts long enough for the good engine on a loaded machine.
			h := newHarness(t, timeouts("1s", "1s", "auto"), nil,
				map[string]string{"a-bad": "m@" + addr(bad), "b-good": "m@" + addr(ok)}) // round robin starts at a-bad
			resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
			must.Eq(t, 200, resp.StatusCode)
			must.Eq(t, roleChunk+tokenChunk("he")+tokenChunk("llo")+"data: [DONE]\n\n", readAllString(t, resp))
			must.Eq(t, int64(1), good.Load())
			must.Eq(t, 1.0, promtest.ToFloat64(h.m.Retries.WithLabelValues("m")))
			if tc.phase != "" {
				must.Eq(t, 1.0, promtest.ToFloat64(h.m.UpstreamTimeouts.WithLabelValues("m", tc.phase)))
			}
		})
		t.Run(tc.name+", no other worker", func(t *testing.T) {
			bad := sseEngineFunc(t, tc.script)
			h := newHarness(t, timeouts("300ms", "300ms", "auto"), nil, map[string]string{"a": "m@" + addr(bad)})
			resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
			want, code := http.StatusBadGateway, "upstream_unavailable"
			if tc.phase != "" {
				want, code = http.StatusGatewayTimeout, "upstream_timeout"
			}
			must.Eq(t, want, resp.StatusCode)
			must.Eq(t, code, *readErr(t, resp).Error.Code)
			// The frozen engine held neither the request nor its worker slot.
			testutil.Eventually(t, 5*time.Second, "the worker's in-flight gauge to return to 0", func() bool { return promtest.ToFloat64(h.m.WorkerInFlight.WithLabelValues("m", "a")) == 0 })
		})
	}
}

// The engines here send no token ids, so their streams cannot be migrated
// (migrate.go): they end as before in-flight migration.
func TestFailureAfterFirstTokenEndsWithErrorEvent(t *testing.T) {
	cases := []struct {
		name, code, reason string
		script             func(http.ResponseWriter, *http.Request, func(string))
	}{
		{"engine killed mid-stream", "upstream_error", "upstream_broken", func(w http.ResponseWriter, _ *http.Request, send func(string)) {
			send(roleChunk + tokenChunk("he"))
			crash(w)
		}},
		{"engine frozen mid-stream", "upstream_timeout", "stream_idle", func(_ http.ResponseWriter, r *http.Request, send func(string)) {
			send(roleChunk + tokenChunk("he"))
			freeze(r)
		}},
		{"engine killed inside an event", "upstream_error", "upstream_broken", func(w http.ResponseWriter, _ *http.Request, send func(string)) {
			send(roleChunk + tokenChunk("he") + `data: {"choi`)
			crash(w)
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var other atomic.Int64
			bad := sseEngineFunc(t, tc.script)
			ok := goodEngine(t, &other)
			h := newHarness(t, timeouts("1s", "300ms", "auto"), nil, map[string]string{"a": "m@" + addr(bad), "b": "m@" + addr(ok)})
			resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
			must.Eq(t, 200, resp.StatusCode)
			body := readAllString(t, resp)
			must.StrHasPrefix(t, roleChunk+tokenChunk("he"), body)
			must.Eq(t, tc.code, errorEventCode(t, body))
			must.Eq(t, int64(0), other.Load()) // never retried once a token was sent
			must.Eq(t, 1.0, promtest.ToFloat64(h.m.StreamErrors.WithLabelValues("m", tc.reason)))
		})
	}
}

func TestHoldEndsAfterItsBound(t *testing.T) {
	// The first token is late: the head and role chunk reach the client
	// when the hold's bound passes, and a failure after that is no longer
	// retried.
	const hold = 200 * time.Millisecond
	var other atomic.Int64
	slow := sseEngineFunc(t, func(w http.ResponseWriter, _ *http.Request, send func(string)) {
		send(roleChunk)
		time.Sleep(10 * hold) // the input: a first token far past the hold's bound
		crash(w)
	})
	ok := goodEngine(t, &other)
	h := newHarness(t, timeouts("5s", "5s", hold.String()), nil, map[string]string{"a": "m@" + addr(slow), "b": "m@" + addr(ok)})
	start := time.Now()
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
	headAfter := time.Since(start)
	must.Eq(t, 200, resp.StatusCode)
	must.Between(t, hold, headAfter, 5*hold) // long before the engine fails
	body := readAllString(t, resp)
	must.StrHasPrefix(t, roleChunk, body)
	must.Eq(t, "upstream_error", errorEventCode(t, body))
	must.Eq(t, int64(0), other.Load())
}

func TestHoldReleasesOnFirstToken(t *testing.T) {
	// Without a role chunk (completions), with one, and with a finish or an
	// engine's own error instead of a token: the hold ends at once.
	cases := map[string]string{
		"completion token": "data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"finish_reason\":null}]}\n\n",
		"role then token":  roleChunk + tokenChunk("x"),
		"finish":           "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
		"engine error":     "data: {\"error\":{\"message\":\"bad\"}}\n\n",
		"tool call":        "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n",
	}
	for name, first := range cases {
		t.Run(name, func(t *testing.T) {
			e := sseEngineFunc(t, func(_ http.ResponseWriter, r *http.Request, send func(string)) {
				send(first)
				freeze(r) // the test reads the first bytes long before the stream ends
			})
			h := newHarness(t, timeouts("5s", "5s", "10s"), nil, map[string]string{"a": "m@" + addr(e)})
			resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
			defer resp.Body.Close()
			got := make([]byte, len(first))
			done := make(chan error, 1)
			go func() { _, err := io.ReadFull(resp.Body, got); done <- err }()
			select {
			case err := <-done:
				must.NoError(t, err)
			case <-time.After(3 * time.Second):
				t.Fatal("held past the first token")
			}
			must.Eq(t, first, string(got))
		})
	}
}

func TestIsPreamble(t *testing.T) {
	cases := []struct {
		ev   string
		want bool
	}{
		{strings.TrimSuffix(roleChunk, "\n\n"), true},
		{`data: {"choices":[{"index":0,"delta":{"role":"assistant"},"logprobs":null}],"usage":{"prompt_tokens":3}}`, true},
		{`data: {"choices":[{"delta":{"content":null,"reasoning_content":"","tool_calls":[]}}]}`, true},
		{": keep-alive comment", true},
		{"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r", true},
		{`data: {"choices":[{"delta":{"reasoning_content":"hm"}}]}`, false},
		{`data: {"choices":[{"text":""}]}`, true},
		{`data: {"choices":[]}`, false},
		{`data: [DONE]`, false},
		{`data: not json`, false},
		{"event: error\ndata: {}", false},
		{`data: {"choices":[{"delta":{"refusal":"no"}}]}`, false},
		{`data: {"choices":[{"delta":{"content":"a \"content\":\"\" b"}}]}`, false},
		{`data: {"choices":[{"delta":{"role":"assistant","content":""},"logprobs":{"content":[]}}]}`, true},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, isPreamble([]byte(tc.ev)), must.Sprint(tc.ev))
	}
}

func TestHoldBufferFeed(t *testing.T) {
	var h holdBuffer
	must.False(t, h.feed([]byte(roleChunk[:10])))
	must.False(t, h.feed([]byte(roleChunk[10:])))
	must.False(t, h.feed([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"a")))
	must.True(t, h.feed([]byte("b\"}}]}\n\n")))
	must.Eq(t, roleChunk+"data: {\"choices\":[{\"delta\":{\"content\":\"ab\"}}]}\n\n", string(h.data))

	var big holdBuffer
	must.True(t, big.feed(bytes.Repeat([]byte{':'}, maxHeld+1))) // never held without bound
}

func TestHoldForFollowsObservedTTFT(t *testing.T) {
	h := newHarness(t, nil, nil, map[string]string{})
	x := &exchange{req: &scoring.Request{Model: "m"}, pol: policy.Resolved{Timeouts: policy.UpstreamTimeouts{HoldAuto: true}}}
	must.Eq(t, maxAutoHold, h.gw.holdFor(x)) // nothing observed yet
	for i := range ttftWindowSize {
		d := 10 * time.Millisecond
		if i%100 == 0 {
			d = 2 * time.Second // the tail
		}
		h.gw.ttft.observe("m", d)
	}
	must.Eq(t, 4*time.Second, h.gw.holdFor(x))
	for range ttftWindowSize {
		h.gw.ttft.observe("m", time.Millisecond)
	}
	must.Eq(t, minAutoHold, h.gw.holdFor(x))
	x.pol.Timeouts = policy.UpstreamTimeouts{FirstTokenHold: 0}
	must.Eq(t, time.Duration(0), h.gw.holdFor(x)) // "0s": no hold
}

// rawRequest writes req to the router over a new connection and reads its
// answer.
func rawRequest(t *testing.T, url, req string, pause time.Duration) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	must.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = io.WriteString(c, req)
	must.NoError(t, err)
	_ = c.SetReadDeadline(time.Now().Add(pause + 5*time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	must.NoError(t, err)
	return resp
}

func TestMalformedChunkedBodyIs400(t *testing.T) {
	var hits atomic.Int64
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(echoEngine(t, "a", &hits))})
	resp := rawRequest(t, h.srv.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\n"+
		"Transfer-Encoding: chunked\r\n\r\nzz\r\n{\"model\":\"m\"}\r\n0\r\n\r\n", 0)
	must.Eq(t, http.StatusBadRequest, resp.StatusCode)
	e := readErr(t, resp)
	must.Eq(t, "invalid_request", *e.Error.Code)
	must.StrContains(t, e.Error.Message, "malformed request body")
	must.Eq(t, int64(0), hits.Load())
}

func TestSlowBodyTimesOut(t *testing.T) {
	var hits atomic.Int64
	h := newHarnessWith(t, Config{BodyReadTimeout: 200 * time.Millisecond}, nil,
		map[string]string{"a": "m@" + addr(echoEngine(t, "a", &hits))})
	start := time.Now()
	// Ten of the hundred bytes announced, then nothing.
	resp := rawRequest(t, h.srv.URL, "POST /v1/completions HTTP/1.1\r\nHost: r\r\nContent-Length: 100\r\n\r\n{\"model\":", time.Second)
	must.Eq(t, http.StatusRequestTimeout, resp.StatusCode)
	must.Eq(t, "request_timeout", *readErr(t, resp).Error.Code)
	must.Less(t, 2*time.Second, time.Since(start))
	must.Eq(t, int64(0), hits.Load())
}

func TestDiscoveryNotSyncedIs503(t *testing.T) {
	h := newHarness(t, nil, nil, nil) // no source has answered yet (Consul unreachable at start-up)
	resp := h.post("/v1/chat/completions", `{"model":"m"}`)
	must.Eq(t, http.StatusServiceUnavailable, resp.StatusCode)
	must.Eq(t, "1", resp.Header.Get("Retry-After"))
	must.Eq(t, "no_healthy_worker", *readErr(t, resp).Error.Code)

	h.setEngines(map[string]string{}) // discovery answered: nobody serves m
	resp = h.post("/v1/chat/completions", `{"model":"m"}`)
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	must.Eq(t, "model_not_found", *readErr(t, resp).Error.Code)
}

func TestConnectionNamedFieldsNotForwarded(t *testing.T) {
	seen := make(chan http.Header, 1)
	a, _ := rawEngine(t, func(int) (string, bool) {
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: X-Internal\r\nX-Internal: 1\r\n" +
			"X-Kept: 1\r\nContent-Length: 2\r\n\r\n{}", false
	})
	// A second engine, net/http's, to see the request's header.
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen <- r.Header.Clone()
		_, _ = io.WriteString(w, "{}")
	}))
	t.Cleanup(e.Close)

	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	resp := h.post("/v1/completions", `{"model":"m"}`, "Connection", "X-Secret, keep-alive", "X-Secret", "s", "X-Kept", "k")
	readAllString(t, resp)
	got := <-seen
	must.Eq(t, "", got.Get("X-Secret"))
	must.Eq(t, "k", got.Get("X-Kept"))

	h.setEngines(map[string]string{"a": "m@" + a})
	resp = h.post("/v1/completions", `{"model":"m"}`)
	must.Eq(t, "{}", readAllString(t, resp))
	must.Eq(t, "", resp.Header.Get("X-Internal"))
	must.Eq(t, "1", resp.Header.Get("X-Kept"))
}

// socketsTo counts this process's TCP sockets to port in any of states
// (/proc/net/tcp's codes: 01 ESTABLISHED, 08 CLOSE_WAIT).
func socketsTo(t *testing.T, port int, states ...string) int {
	t.Helper()
	n := 0
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			fs := strings.Fields(line)
			// fields: sl local remote st ...; CLOSE_WAIT is 08
			if len(fs) > 3 && slices.Contains(states, fs[3]) && strings.HasSuffix(fs[2], fmt.Sprintf(":%04X", port)) {
				n++
			}
		}
	}
	return n
}

func TestIdleEngineConnectionsClosedWithTheEngine(t *testing.T) {
	if _, err := os.Stat("/proc/net/tcp"); err != nil {
		t.Skip("needs /proc/net/tcp (Linux) to see socket states")
	}
	var hits atomic.Int64
	e := echoEngine(t, "a", &hits)
	port, err := strconv.Atoi(e.URL[strings.LastIndex(e.URL, ":")+1:])
	must.NoError(t, err)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	for range 8 {
		resp := h.post("/v1/completions", `{"model":"m"}`)
		readAllString(t, resp)
	}
	e.CloseClientConnections() // the engine goes away, closing its side of each pooled connection
	// None left ESTABLISHED: the engine's FINs arrived; none in CLOSE_WAIT:
	// the router closed its side.
	testutil.Eventually(t, 5*time.Second, "no socket to the engine established or in CLOSE_WAIT", func() bool {
		return socketsTo(t, port, "01", "08") == 0
	})
}
