package gateway

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// These tests exercise the proxy mechanics against httptest engines; the
// integration and e2e packages run the same code against oasis-sim.

type harness struct {
	t    testing.TB
	pool *discovery.Pool
	m    *metrics.Metrics
	reg  *prometheus.Registry
	gw   *Gateway
	srv  *httptest.Server
	doc  *policy.Document
}

func newHarness(t *testing.T, doc *policy.Document, authn *auth.Authenticator, engines map[string]string) *harness {
	t.Helper()
	return newHarnessWith(t, Config{Auth: authn}, doc, engines)
}

// newHarnessWith serves a gateway configured by c (its pool, policy,
// selector, admission and metrics filled in here) over net/http, as
// oasis-router serves it. A nil engines map leaves the pool unsynced, as
// before discovery's first answer.
func newHarnessWith(t testing.TB, c Config, doc *policy.Document, engines map[string]string) *harness {
	t.Helper()
	if doc == nil {
		doc = &policy.Document{Policy: scoring.RoundRobin}
	}
	h := &harness{t: t, pool: discovery.New(discovery.Config{}), reg: prometheus.NewRegistry(), doc: doc}
	h.m = metrics.New(h.reg)
	if engines != nil {
		h.setEngines(engines)
	}
	terms, err := scoring.NewRegistry(scoring.BuiltinTerms()...)
	must.NoError(t, err)
	c.Pool, c.Policy, c.Selector, c.Admission = h.pool, StaticPolicy{Doc: doc}, scoring.NewSelector(scoring.SelectorConfig{Registry: terms}), admission.New()
	c.Metrics, c.Gatherer, c.Logger = h.m, h.reg, hclog.NewNullLogger()
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 1 << 10
	}
	if c.Transport == nil {
		c.Transport = engineTransport(t)
	}
	h.gw, err = New(c)
	must.NoError(t, err)
	h.srv = httptest.NewServer(h.gw)
	t.Cleanup(h.srv.Close)
	return h
}

// engineTransport is a gateway's transport to engines whose idle
// connections close with the test: registered before the gateway's server,
// its cleanup runs after that server's Close, when no handler uses a
// connection any more. Without it every pooled connection lives (its read
// and write loops, which goleak in TestMain counts) for as long as the
// engine's end stays open.
func engineTransport(t testing.TB) *http.Transport {
	tr := NewEngineTransport(EngineTransportConfig{})
	t.Cleanup(tr.CloseIdleConnections)
	return tr
}

// setEngines sets the pool: id → "model@host:port".
func (h *harness) setEngines(engines map[string]string) {
	var ins []discovery.Instance
	for id, spec := range engines {
		model, addr, _ := strings.Cut(spec, "@")
		ins = append(ins, discovery.Instance{ID: id, Address: addr, Meta: map[string]string{discovery.MetaModel: model}})
	}
	h.pool.Set(ins)
}

func (h *harness) post(path, body string, hdr ...string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest(http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	must.NoError(h.t, err)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	must.NoError(h.t, err)
	return resp
}

func addr(s *httptest.Server) string { return strings.TrimPrefix(s.URL, "http://") }

// deadAddr is a loopback address that refuses connections for the rest of
// the test. A port that was only free a moment ago is not enough: one of
// the test's own servers, created after it (an engine, the gateway's),
// could take it and answer for the "dead" worker.
func deadAddr(t testing.TB) string {
	a, _ := testutil.RefusingAddr(t)
	return a
}

// echoEngine answers with the sha256 of the body it received and counts requests.
func echoEngine(t *testing.T, name string, hits *atomic.Int64) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		sum := sha256.Sum256(b)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"engine":%q,"body_sha256":%q,"usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`,
			name, hex.EncodeToString(sum[:]))
	}))
	t.Cleanup(s.Close)
	return s
}

type apiErr struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
		Param   *string `json:"param"`
	} `json:"error"`
}

func readErr(t *testing.T, resp *http.Response) apiErr {
	t.Helper()
	defer resp.Body.Close()
	must.Eq(t, "application/json", resp.Header.Get("Content-Type"))
	var e apiErr
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	must.NotEq(t, "", e.Error.Message)
	must.NotEq(t, "", e.Error.Type)
	return e
}

func TestBodyForwardedUnchanged(t *testing.T) {
	var hits atomic.Int64
	e := echoEngine(t, "a", &hits)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],"response_format":{"type":"json_object"},"logprobs":true,"seed":7,"x_unknown":[1,2.50,"\u00e9"]}`
	resp := h.post("/v1/chat/completions", body)
	defer resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	var got struct {
		Sum string `json:"body_sha256"`
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&got))
	sum := sha256.Sum256([]byte(body))
	must.Eq(t, hex.EncodeToString(sum[:]), got.Sum)
	must.NotEq(t, "", resp.Header.Get("X-Request-Id"))
	// Usage is taken from the engine's answer (recorded as the handler ends,
	// which may be just after the client has the body).
	testutil.Eventually(t, 5*time.Second, "the request to be counted", func() bool { return promtest.ToFloat64(h.m.Requests.WithLabelValues("m", "200", "a")) == 1 })
	must.Eq(t, 5.0, promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "a", "completion")))
}

func TestBadInput(t *testing.T) {
	var hits atomic.Int64
	e := echoEngine(t, "a", &hits)
	h := newHarness(t, &policy.Document{Policy: scoring.RoundRobin, Models: map[string]policy.Model{"configured": {}}},
		nil, map[string]string{"a": "m@" + addr(e)})
	cases := []struct {
		name, path, body string
		hdr              []string
		status           int
		code             string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"model":`, nil, 400, "invalid_request"},
		{"not an object", "/v1/completions", `[1,2]`, nil, 400, "invalid_request"},
		{"model not a string", "/v1/completions", `{"model":3}`, nil, 400, "invalid_request"},
		{"unknown model", "/v1/completions", `{"model":"nope"}`, nil, 404, "model_not_found"},
		{"body too large", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 2000) + `"}`, nil, 413, "request_too_large"},
		{"configured model, no worker", "/v1/completions", `{"model":"configured"}`, nil, 503, "no_healthy_worker"},
		{"bad deadline", "/v1/completions", `{"model":"m"}`, []string{DeadlineHeader, "soon"}, 400, "invalid_deadline"},
		{"unknown path", "/v1/nothing", `{}`, nil, 404, "unknown_url"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post(tc.path, tc.body, tc.hdr...)
			must.Eq(t, tc.status, resp.StatusCode)
			e := readErr(t, resp)
			must.NotNil(t, e.Error.Code)
			must.Eq(t, tc.code, *e.Error.Code)
			if strings.Contains(tc.name, "model") && tc.status == 400 {
				must.NotNil(t, e.Error.Param)
				must.Eq(t, "model", *e.Error.Param)
			}
			if tc.name == "malformed JSON" {
				must.Nil(t, e.Error.Param)
			}
			if tc.status == 503 {
				must.NotEq(t, "", resp.Header.Get("Retry-After"))
			}
		})
	}
	must.Eq(t, int64(0), hits.Load())
}

func TestModelLeavesPoolGives503(t *testing.T) {
	var hits atomic.Int64
	e := echoEngine(t, "a", &hits)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	resp := h.post("/v1/completions", `{"model":"m"}`)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	h.setEngines(nil)
	resp = h.post("/v1/completions", `{"model":"m"}`)
	must.Eq(t, 503, resp.StatusCode)
	must.Eq(t, "no_healthy_worker", *readErr(t, resp).Error.Code)
}

func TestStreamingFlushesEachEvent(t *testing.T) {
	// The engine sends one event and then waits until the test has read it
	// through the router: a buffering proxy would deadlock here.
	next := make(chan struct{})
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
			select {
			case <-next:
			case <-time.After(10 * time.Second):
				return
			}
		}
		fmt.Fprint(w, "data: {\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n")
	}))
	defer e.Close()
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"stream_options":{"include_usage":true}}`)
	defer resp.Body.Close()
	must.Eq(t, "text/event-stream", resp.Header.Get("Content-Type"))
	br := bufio.NewReader(resp.Body)
	for i := range 3 {
		line, err := br.ReadString('\n')
		must.NoError(t, err)
		must.Eq(t, fmt.Sprintf("data: {\"i\":%d}\n", i), line)
		_, _ = br.ReadString('\n')
		next <- struct{}{}
	}
	rest, err := io.ReadAll(br)
	must.NoError(t, err)
	must.StrContains(t, string(rest), "[DONE]")
	testutil.Eventually(t, 5*time.Second, "the usage to be counted", func() bool { return promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "a", "completion")) == 3 })
}

func TestRetryBeforeFirstByte(t *testing.T) {
	var good atomic.Int64
	ok := echoEngine(t, "good", &good)
	var bad atomic.Int64
	failing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		bad.Add(1)
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer failing.Close()
	cases := []struct {
		name    string
		engines map[string]string
	}{
		{"connect refused", map[string]string{"a-dead": "m@" + deadAddr(t), "b-good": "m@" + addr(ok)}},
		{"5xx", map[string]string{"a-5xx": "m@" + addr(failing), "b-good": "m@" + addr(ok)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, nil, nil, tc.engines) // round robin starts at a-*
			good.Store(0)
			resp := h.post("/v1/completions", `{"model":"m","prompt":"x"}`)
			resp.Body.Close()
			must.Eq(t, 200, resp.StatusCode)
			must.Eq(t, int64(1), good.Load())
			must.Eq(t, 1.0, promtest.ToFloat64(h.m.Retries.WithLabelValues("m")))
		})
	}
	t.Run("only one retry", func(t *testing.T) {
		bad.Store(0)
		f2 := httptest.NewServer(failing.Config.Handler)
		defer f2.Close()
		f3 := httptest.NewServer(failing.Config.Handler)
		defer f3.Close()
		h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(failing), "b": "m@" + addr(f2), "c": "m@" + addr(f3)})
		resp := h.post("/v1/completions", `{"model":"m"}`)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.Eq(t, 500, resp.StatusCode) // the engine's own answer on the last attempt
		must.StrContains(t, string(body), "boom")
		must.Eq(t, int64(2), bad.Load())
	})
	t.Run("no worker left", func(t *testing.T) {
		h := newHarness(t, nil, nil, map[string]string{"a": "m@" + deadAddr(t)})
		resp := h.post("/v1/completions", `{"model":"m"}`)
		must.Eq(t, 503, resp.StatusCode) // refused connections: no engine was reached
		must.Eq(t, "no_reachable_worker", *readErr(t, resp).Error.Code)
		must.NotEq(t, "", resp.Header.Get("Retry-After"))
	})
}

func TestNoRetryAfterFirstByte(t *testing.T) {
	var second atomic.Int64
	other := echoEngine(t, "b", &second)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close() // engine dies mid-stream
		}
	}))
	defer broken.Close()
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(broken), "b": "m@" + addr(other)})
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
	must.Eq(t, 200, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.NoError(t, err) // a proper end of the body, after an error event
	must.StrHasPrefix(t, "data: {\"i\":0}\n\n", string(body))
	must.Eq(t, "upstream_error", errorEventCode(t, string(body)))
	must.Eq(t, int64(0), second.Load())
	must.Eq(t, 0.0, promtest.ToFloat64(h.m.Retries.WithLabelValues("m")))
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.StreamErrors.WithLabelValues("m", "upstream_broken")))
}

// errorEventCode checks that an event stream ends with an error event in
// OpenAI's shape and then [DONE], and returns the error's code.
func errorEventCode(t *testing.T, body string) string {
	t.Helper()
	rest, ok := strings.CutSuffix(body, "\n\ndata: [DONE]\n\n")
	must.True(t, ok, must.Sprintf("stream does not end with [DONE]: %q", body))
	i := strings.LastIndex(rest, "data: ")
	must.Positive(t, i+1, must.Sprintf("no error event in %q", body))
	must.True(t, i >= 2 && rest[i-2:i] == "\n\n", must.Sprintf("error event not on an event boundary: %q", body))
	var e apiErr
	must.NoError(t, json.Unmarshal([]byte(rest[i+len("data: "):]), &e))
	must.Eq(t, "server_error", e.Error.Type)
	must.NotEq(t, "", e.Error.Message)
	must.NotNil(t, e.Error.Code)
	return *e.Error.Code
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	cancelled := make(chan struct{})
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {}\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(10 * time.Second):
		}
	}))
	defer e.Close()
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(`{"model":"m","stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	_, err = bufio.NewReader(resp.Body).ReadString('\n')
	must.NoError(t, err)
	cancel()
	resp.Body.Close()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("upstream request was not cancelled after the client left")
	}
}

func TestDeadlineHeader(t *testing.T) {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // lets the server notice the router hanging up
		select {
		case <-r.Context().Done():
		case <-time.After(5 * time.Second):
		}
	}))
	defer e.Close()
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	resp := h.post("/v1/completions", `{"model":"m"}`, DeadlineHeader, "50")
	must.Eq(t, 504, resp.StatusCode)
	must.Eq(t, "deadline_exceeded", *readErr(t, resp).Error.Code)
}

func TestAdmissionQueueFull(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 4)
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		fmt.Fprint(w, `{}`)
	}))
	defer e.Close()
	one, zero, timeout := 1, 1, "5s"
	doc := &policy.Document{Policy: scoring.LeastLoad, Admission: policy.Admission{MaxInFlight: &one, MaxQueue: &zero, QueueTimeout: &timeout}}
	h := newHarness(t, doc, nil, map[string]string{"a": "m@" + addr(e)})
	results := make(chan int, 2)
	for range 2 {
		go func() {
			resp := h.post("/v1/completions", `{"model":"m"}`)
			resp.Body.Close()
			results <- resp.StatusCode
		}()
	}
	<-started
	testutil.Eventually(t, 5*time.Second, "one request queued", func() bool { return h.gw.cfg.Admission.Queued("m") == 1 })
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.Queued.WithLabelValues("m")))
	resp := h.post("/v1/completions", `{"model":"m"}`)
	must.Eq(t, 429, resp.StatusCode)
	must.Eq(t, "1", resp.Header.Get("Retry-After"))
	must.Eq(t, "model_overloaded", *readErr(t, resp).Error.Code)
	close(release)
	must.Eq(t, 200, <-results)
	must.Eq(t, 200, <-results)
	testutil.Eventually(t, 5*time.Second, "the refusal to be counted", func() bool { return promtest.ToFloat64(h.m.AdmissionRefused.WithLabelValues("m", "queue_full")) == 1 })
	must.Eq(t, 0.0, promtest.ToFloat64(h.m.Queued.WithLabelValues("m")))
}

// A key with a models list calls only those models, as OpenAI answers a key
// without access (404 model_not_found), and lists only them.
func TestKeyModelsAllowlist(t *testing.T) {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, `{}`) }))
	defer e.Close()
	sum := sha256.Sum256([]byte("sk-a"))
	specs, err := auth.Parse([]byte(fmt.Sprintf(`{"keys":[{"id":"team","sha256":%q,"models":["a"]}]}`, hex.EncodeToString(sum[:]))))
	must.NoError(t, err)
	authn := auth.New()
	authn.Set(specs)
	h := newHarness(t, nil, authn, map[string]string{"a": "a@" + addr(e), "b": "b@" + addr(e)})
	bearer := []string{"Authorization", "Bearer sk-a"}
	resp := h.post("/v1/completions", `{"model":"a"}`, bearer...)
	resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	resp = h.post("/v1/completions", `{"model":"b"}`, bearer...)
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	e404 := readErr(t, resp)
	must.Eq(t, "model_not_found", *e404.Error.Code)
	must.StrContains(t, e404.Error.Message, "do not have access")

	req, err := http.NewRequest(http.MethodGet, h.srv.URL+"/v1/models", nil)
	must.NoError(t, err)
	req.Header.Set("Authorization", "Bearer sk-a")
	resp, err = http.DefaultClient.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	must.Len(t, 1, list.Data)
	must.Eq(t, "a", list.Data[0].ID)
}

func TestAuthAndRateLimit(t *testing.T) {
	var hits atomic.Int64
	var sawAuth atomic.Value
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		sawAuth.Store(r.Header.Get("Authorization"))
		fmt.Fprint(w, `{}`)
	}))
	defer e.Close()
	sum := sha256.Sum256([]byte("sk-good"))
	specs, err := auth.Parse([]byte(fmt.Sprintf(`{"keys":[{"id":"team","sha256":%q,"rate_per_second":0.001,"burst":2}]}`, hex.EncodeToString(sum[:]))))
	must.NoError(t, err)
	a := auth.New()
	a.Set(specs)
	h := newHarness(t, nil, a, map[string]string{"a": "m@" + addr(e)})
	cases := []struct {
		name   string
		hdr    []string
		status int
	}{
		{"no key", nil, 401},
		{"wrong key", []string{"Authorization", "Bearer sk-bad"}, 401},
		{"good 1", []string{"Authorization", "Bearer sk-good"}, 200},
		{"good 2", []string{"Authorization", "Bearer sk-good"}, 200},
		{"bucket empty", []string{"Authorization", "Bearer sk-good"}, 429},
		// A client-supplied header never selects another bucket.
		{"spoofed id header", []string{"Authorization", "Bearer sk-good", "X-Api-Key-Id", "other"}, 429},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp := h.post("/v1/completions", `{"model":"m"}`, tc.hdr...)
			must.Eq(t, tc.status, resp.StatusCode)
			if tc.status != 200 {
				readErr(t, resp)
			} else {
				resp.Body.Close()
			}
			if tc.status == 429 {
				must.NotEq(t, "", resp.Header.Get("Retry-After"))
			}
		})
	}
	must.Eq(t, int64(2), hits.Load())
	must.Eq(t, "", sawAuth.Load().(string)) // the router's key is not passed on
	// Health and metrics stay open.
	for _, p := range []string{"/health", "/metrics"} {
		resp, err := http.Get(h.srv.URL + p)
		must.NoError(t, err)
		resp.Body.Close()
		must.Eq(t, 200, resp.StatusCode)
	}
}

func TestModelsAndReady(t *testing.T) {
	var hits atomic.Int64
	e := echoEngine(t, "a", &hits)
	h := newHarness(t, nil, nil, map[string]string{"a": "alpha@" + addr(e), "b": "beta@" + addr(e), "c": "alpha@" + addr(e)})
	resp, err := http.Get(h.srv.URL + "/v1/models")
	must.NoError(t, err)
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID, Object string
		} `json:"data"`
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	resp.Body.Close()
	must.Eq(t, "list", list.Object)
	must.Eq(t, 2, len(list.Data))
	must.Eq(t, "alpha", list.Data[0].ID)
	must.Eq(t, "beta", list.Data[1].ID)

	resp, _ = http.Get(h.srv.URL + "/ready")
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	h.gw.Drain()
	resp, _ = http.Get(h.srv.URL + "/ready")
	resp.Body.Close()
	must.Eq(t, 503, resp.StatusCode)
}

func TestPolicySpreadsRequests(t *testing.T) {
	var a, b, c atomic.Int64
	ea, eb, ec := echoEngine(t, "a", &a), echoEngine(t, "b", &b), echoEngine(t, "c", &c)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(ea), "b": "m@" + addr(eb), "c": "m@" + addr(ec)})
	for range 30 {
		resp := h.post("/v1/completions", `{"model":"m"}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	must.Eq(t, []int64{10, 10, 10}, []int64{a.Load(), b.Load(), c.Load()})
}

func TestUsageScanner(t *testing.T) {
	cases := []struct {
		name   string
		sse    bool
		chunks []string
		p, c   int64
		ok     bool
	}{
		{"json", false, []string{`{"id":"x","usage":{"prompt_tokens":7,`, `"completion_tokens":9}}`}, 7, 9, true},
		{"sse split across reads", true, []string{"data: {\"choices\":[]}\n\nda", "ta: {\"usage\":{\"prompt_tokens\":1,\"compl", "etion_tokens\":2}}\n\ndata: [DONE]\n\n"}, 1, 2, true},
		{"sse without usage", true, []string{"data: {\"x\":1}\n\ndata: [DONE]\n\n"}, 0, 0, false},
		{"usage null", false, []string{`{"usage":null}`}, 0, 0, false},
		// The Responses API's names, and its stream's response.completed event.
		{"responses json", false, []string{`{"id":"resp_1","usage":{"input_tokens":7,"output_tokens":9,"total_tokens":16}}`}, 7, 9, true},
		{"responses events", true, []string{"event: response.created\ndata: {\"response\":{\"usage\":null}}\n\n",
			"event: response.completed\ndata: {\"response\":{\"id\":\"r\",\"usage\":{\"input_tokens\":3,", "\"output_tokens\":4}}}\n\n"}, 3, 4, true},
		{"responses created only", true, []string{"event: response.created\ndata: {\"response\":{\"usage\":null}}\n\n"}, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := usageScanner{sse: tc.sse}
			for _, ch := range tc.chunks {
				u.feed([]byte(ch))
			}
			p, c, ok := u.result()
			must.Eq(t, tc.ok, ok)
			must.Eq(t, tc.p, p)
			must.Eq(t, tc.c, c)
		})
	}
	_ = bytes.MinRead
}

func TestDeadlineMidStreamEndsWithErrorEvent(t *testing.T) {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; ; i++ {
			if _, err := fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			select {
			case <-r.Context().Done():
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}))
	defer e.Close()
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`, DeadlineHeader, "150")
	must.Eq(t, 200, resp.StatusCode)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.NoError(t, err)
	must.StrContains(t, string(body), `{"i":0}`)
	must.Eq(t, "deadline_exceeded", errorEventCode(t, string(body)))
	testutil.Eventually(t, 5*time.Second, "the request to be counted", func() bool { return promtest.ToFloat64(h.m.Requests.WithLabelValues("m", "504", "a")) == 1 })
}

func TestRequestIDsAreUnique(t *testing.T) {
	a, b := newRequestIDs(), newRequestIDs()
	seen := map[string]bool{}
	for range 1000 {
		for _, id := range []string{a.next(), b.next()} {
			if len(id) != 24 || strings.Trim(id, "0123456789abcdef") != "" {
				t.Fatalf("request id %q: want 24 lower-case hex digits", id)
			}
			if seen[id] {
				t.Fatalf("request id %q generated twice", id)
			}
			seen[id] = true
		}
	}
}

func TestMentionsUsage(t *testing.T) {
	for _, s := range []string{"", "g", `"usage"`, `usage"`, `"usage`, `x"usage":1`, `"usag"`, `gggg"usage"gg`,
		`data: {"choices":[],"usage":{"prompt_tokens":1}}`, `"usAge"`, `"usage""usage"`, `ag"usage`} {
		must.Eq(t, bytes.Contains([]byte(s), []byte(`"usage"`)), mentionsUsage([]byte(s)), must.Sprint(s))
	}
}
