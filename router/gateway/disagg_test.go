package gateway

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
)

// These tests run disaggregated requests through the real gateway: the vLLM
// protocol against oasis-sim processes and against scripted engines (for
// failures), the SGLang protocol against scripted engines that check every
// field of each leg. Engines are described by pdInstance, so SGLang tests
// against oasis-sim's SGLang mode can use the same harness.

// leg is one request an engine received.
type leg struct {
	body  map[string]any
	reqID string
}

// pdEngine is a scripted engine that records its legs.
type pdEngine struct {
	srv  *httptest.Server
	mu   sync.Mutex
	legs []leg
}

// newPDEngine serves answer for every request, after recording it.
func newPDEngine(t testing.TB, answer func(w http.ResponseWriter, r *http.Request, body map[string]any)) *pdEngine {
	t.Helper()
	e := &pdEngine{}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]any
		data, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(data, &body)
		e.mu.Lock()
		e.legs = append(e.legs, leg{body: body, reqID: r.Header.Get("X-Request-Id")})
		e.mu.Unlock()
		answer(w, r, body)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *pdEngine) got() []leg {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]leg(nil), e.legs...)
}

// kvAnswer is a vLLM prefill engine's answer: the prompt's first token and
// where its KV waits.
var kvAnswer = map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": "p-engine",
	"remote_block_ids": []any{1.0, 2.0, 3.0}, "remote_host": "10.1.2.3", "remote_port": 5600.0, "tp_size": 1.0}

// vllmPrefill answers prefill legs as vLLM with NixlConnector does.
func vllmPrefill(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "cmpl-p", "choices": []any{map[string]any{"text": "x"}},
		"usage":              map[string]any{"prompt_tokens": 7, "completion_tokens": 1, "total_tokens": 8},
		"kv_transfer_params": kvAnswer})
}

// streamDecode streams two tokens and a usage chunk.
func streamDecode(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	for _, s := range []string{roleChunk, tokenChunk("he"), tokenChunk("llo"),
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}}\n\n", "data: [DONE]\n\n"} {
		_, _ = io.WriteString(w, s)
		w.(http.Flusher).Flush()
	}
}

func failWith(status int) func(http.ResponseWriter, *http.Request, map[string]any) {
	return func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		writeError(w, status, "server_error", "x", "", "scripted failure", 0)
	}
}

// pdInstance registers an engine of model m: role, protocol, then meta pairs.
func pdInstance(id, address, role, proto string, meta ...string) discovery.Instance {
	m := map[string]string{discovery.MetaModel: "m", discovery.MetaRole: role, discovery.MetaPDProtocol: proto}
	for i := 0; i+1 < len(meta); i += 2 {
		m[meta[i]] = meta[i+1]
	}
	return discovery.Instance{ID: id, Address: address, Meta: m}
}

// pdDoc is a policy that disaggregates every prompt (threshold 0) unless
// changed by opts.
func pdDoc(opts ...func(*policy.Document)) *policy.Document {
	zero, hdr, idle, hold := 0, "5s", "5s", "5s"
	d := &policy.Document{Policy: scoring.RoundRobin, Disagg: policy.Disagg{DisaggregationMinUncachedTokens: &zero},
		Timeouts: &policy.Timeouts{ResponseHeader: &hdr, StreamIdle: &idle, FirstTokenHold: &hold}}
	for _, o := range opts {
		o(d)
	}
	return d
}

func pdHarness(t *testing.T, doc *policy.Document, ins ...discovery.Instance) *harness {
	t.Helper()
	h := newHarnessWith(t, Config{MaxBodyBytes: 1 << 20}, doc, map[string]string{})
	h.pool.Set(ins)
	return h
}

// busy makes a worker look loaded to the pair choice.
func busy(h *harness, id string) {
	for _, w := range h.pool.Workers("m") {
		if w.ID == id {
			w.Live.SetEngine(8, 8, 0.9, time.Now())
		}
	}
}

const pdStreamBody = `{"model":"m","prompt":"a long prompt","max_tokens":8,"min_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`

func disaggPath(h *harness, path string) float64 {
	return promtest.ToFloat64(h.m.DisaggRequests.WithLabelValues("m", path))
}

func TestVLLMPairLegs(t *testing.T) {
	p := newPDEngine(t, vllmPrefill)
	d := newPDEngine(t, streamDecode)
	h := pdHarness(t, pdDoc(),
		pdInstance("p1", addr(p.srv), "prefill", "vllm"), pdInstance("d1", addr(d.srv), "decode", "vllm"))
	body := `{"model":"m","prompt":"a long prompt","max_tokens":8,"max_completion_tokens":8,"min_tokens":2,"min_completion_tokens":2,"stream":true,"stream_options":{"include_usage":true},"seed":3}`
	resp := h.post("/v1/completions", body, "X-Request-Id", "req-42")
	must.Eq(t, 200, resp.StatusCode)
	out := readAllString(t, resp)
	must.StrContains(t, out, `"llo"`)
	must.StrContains(t, out, "[DONE]")

	pl, dl := p.got(), d.got()
	must.SliceLen(t, 1, pl)
	must.SliceLen(t, 1, dl)
	pb := pl[0].body
	must.Eq(t, 1.0, pb["max_tokens"])
	must.Eq(t, 1.0, pb["max_completion_tokens"])
	must.Eq(t, false, pb["stream"])
	must.MapNotContainsKey(t, pb, "stream_options")
	must.MapNotContainsKey(t, pb, "min_tokens")
	must.MapNotContainsKey(t, pb, "min_completion_tokens")
	must.Eq(t, map[string]any{"do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": nil,
		"remote_block_ids": nil, "remote_host": nil, "remote_port": nil}, pb["kv_transfer_params"].(map[string]any))
	must.Eq(t, 3.0, pb["seed"])
	// The decode leg is the client's body plus the prefill's answer.
	db := dl[0].body
	must.Eq(t, kvAnswer, db["kv_transfer_params"].(map[string]any))
	must.Eq(t, 8.0, db["max_tokens"])
	must.Eq(t, 2.0, db["min_tokens"])
	must.Eq(t, 2.0, db["min_completion_tokens"])
	must.Eq(t, true, db["stream"])
	must.Eq(t, map[string]any{"include_usage": true}, db["stream_options"].(map[string]any))
	must.Eq(t, "req-42", pl[0].reqID)
	must.Eq(t, "req-42", dl[0].reqID)
	must.Eq(t, "req-42", resp.Header.Get("X-Request-Id"))

	must.Eq(t, 1.0, disaggPath(h, "pair"))
	testutil.Eventually(t, 5*time.Second, "the request to be counted", func() bool {
		return promtest.ToFloat64(h.m.Requests.WithLabelValues("m", "200", "d1")) == 1
	})
	// Prompt tokens once: the decode leg's usage, none for the prefill leg.
	must.Eq(t, 7.0, promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "d1", "prompt")))
	must.Eq(t, 0.0, promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "p1", "prompt")))
	must.Eq(t, uint64(1), histCount(t, h, "oasis_router_prefill_leg_seconds"))
}

func histCount(t *testing.T, h *harness, name string) uint64 {
	t.Helper()
	mfs, err := h.reg.Gather()
	must.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name {
			n := uint64(0)
			for _, m := range mf.GetMetric() {
				n += m.GetHistogram().GetSampleCount()
			}
			return n
		}
	}
	return 0
}

// TestVLLMPairWithSim runs the vLLM protocol against two oasis-sim
// processes (NixlConnector-shaped answers), each behind a recording proxy.
func TestVLLMPairWithSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	sim := func() *testutil.Sim {
		return testutil.StartSim(t, testutil.SimConfig{Bin: bin, Model: "m", Args: []string{"--host", "127.0.0.1",
			"--speed", "0", "--log-level", "warn", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`},
			Env: []string{"VLLM_NIXL_SIDE_CHANNEL_PORT=" + strconv.Itoa(testutil.FreePort(t))}})
	}
	ps, ds := sim(), sim()
	p := newPDEngine(t, proxyTo(ps.Addr))
	d := newPDEngine(t, proxyTo(ds.Addr))
	h := pdHarness(t, pdDoc(),
		pdInstance("p1", addr(p.srv), "prefill", "vllm"), pdInstance("d1", addr(d.srv), "decode", "vllm"))

	resp := h.post("/v1/completions", pdStreamBody)
	must.Eq(t, 200, resp.StatusCode)
	out := readAllString(t, resp)
	must.StrContains(t, out, "[DONE]")
	must.StrContains(t, out, `"usage"`)
	dl := d.got()
	must.SliceLen(t, 1, dl)
	kv := dl[0].body["kv_transfer_params"].(map[string]any)
	must.Eq(t, true, kv["do_remote_prefill"])
	must.StrHasPrefix(t, "oasis-sim-", kv["remote_engine_id"].(string))
	must.SliceLen(t, 1, p.got())
	// The decode engine pulled the prompt's KV from the prefill engine and
	// computed none of it.
	decodeMetrics := getString(t, "http://"+ds.Addr+"/metrics")
	must.StrContains(t, decodeMetrics, `oasis_sim_prompt_tokens_total{engine="0",model_name="m",source="local"} 0`)
	must.StrNotContains(t, decodeMetrics, `oasis_sim_prompt_tokens_total{engine="0",model_name="m",source="remote"} 0`)
	testutil.Eventually(t, 5*time.Second, "the request to be counted", func() bool {
		return promtest.ToFloat64(h.m.Requests.WithLabelValues("m", "200", "d1")) == 1
	})
	must.Positive(t, promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "d1", "prompt")))
	must.Eq(t, 0.0, promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "p1", "prompt")))

	// A non-streamed request: the decode answer is the client's.
	resp = h.post("/v1/completions", `{"model":"m","prompt":"another prompt","max_tokens":4}`)
	must.Eq(t, 200, resp.StatusCode)
	var ans struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&ans))
	resp.Body.Close()
	must.Eq(t, 4, ans.Usage.CompletionTokens)
	must.Eq(t, 2.0, disaggPath(h, "pair"))
}

// TestSGLangPairWithSim runs the SGLang protocol against two oasis-sim
// processes (--disaggregation-mode prefill and decode), each behind a
// recording proxy: the decode engine pulls the room's KV from the prefill
// engine's bootstrap server.
func TestSGLangPairWithSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	bootstrap := testutil.FreePort(t)
	sim := func(mode string, port int) *testutil.Sim {
		return testutil.StartSim(t, testutil.SimConfig{Bin: bin, Model: "m", Args: []string{"--host", "127.0.0.1",
			"--speed", "0", "--log-level", "warn", "--disaggregation-mode", mode,
			"--disaggregation-bootstrap-port", strconv.Itoa(port), "--kv-wait-timeout", "10s"}})
	}
	ps, ds := sim("prefill", bootstrap), sim("decode", testutil.FreePort(t))
	p := newPDEngine(t, proxyTo(ps.Addr))
	d := newPDEngine(t, proxyTo(ds.Addr))
	h := pdHarness(t, pdDoc(),
		pdInstance("p1", addr(p.srv), "prefill", "sglang", discovery.MetaBootstrapPort, strconv.Itoa(bootstrap)),
		pdInstance("d1", addr(d.srv), "decode", "sglang"))

	resp := h.post("/v1/chat/completions", `{"model":"m","stream":true,"max_tokens":6,"stream_options":{"include_usage":true},`+
		`"messages":[{"role":"user","content":"disaggregated serving moves the prefill to another engine"}]}`)
	must.Eq(t, 200, resp.StatusCode)
	must.StrHasPrefix(t, "text/event-stream", resp.Header.Get("Content-Type"))
	events := sseData(t, readAllString(t, resp))
	// One stream: chunks of one completion, usage, then [DONE] once at the end.
	must.Greater(t, 2, len(events))
	must.Eq(t, "[DONE]", events[len(events)-1])
	ids := map[string]bool{}
	var completion float64
	for _, e := range events[:len(events)-1] {
		var c struct {
			ID    string `json:"id"`
			Usage *struct {
				CompletionTokens float64 `json:"completion_tokens"`
			} `json:"usage"`
		}
		must.NoError(t, json.Unmarshal([]byte(e), &c), must.Sprint(e))
		ids[c.ID] = true
		if c.Usage != nil {
			completion = c.Usage.CompletionTokens
		}
	}
	must.MapLen(t, 1, ids, must.Sprint("chunks of more than one completion: ", events))
	must.Eq(t, 6.0, completion) // the decode engine's answer, not the prefill's one token
	pl, dl := p.got(), d.got()
	must.SliceLen(t, 1, pl)
	must.SliceLen(t, 1, dl)
	must.Eq(t, pl[0].body["bootstrap_room"], dl[0].body["bootstrap_room"])
	must.Eq[any](t, float64(bootstrap), dl[0].body["bootstrap_port"])
	// The decode engine pulled the prompt's KV from the prefill engine and
	// computed none of it; the prefill engine computed it.
	decodeMetrics := getString(t, "http://"+ds.Addr+"/metrics")
	must.StrContains(t, decodeMetrics, `oasis_sim_prompt_tokens_total{engine="0",model_name="m",source="local"} 0`)
	must.StrNotContains(t, decodeMetrics, `oasis_sim_prompt_tokens_total{engine="0",model_name="m",source="remote"} 0`)
	must.StrContains(t, decodeMetrics, `oasis_sim_prompt_tokens_total{engine="0",model_name="m",source="remote"}`)
	must.StrNotContains(t, getString(t, "http://"+ps.Addr+"/metrics"),
		`oasis_sim_prompt_tokens_total{engine="0",model_name="m",source="local"} 0`)
	must.Eq(t, 1.0, disaggPath(h, "pair"))
	testutil.Eventually(t, 5*time.Second, "the request to be counted", func() bool {
		return promtest.ToFloat64(h.m.Requests.WithLabelValues("m", "200", "d1")) == 1
	})
}

// sseData is a stream's data payloads, in order.
func sseData(t *testing.T, stream string) []string {
	t.Helper()
	var out []string
	for _, line := range strings.Split(stream, "\n") {
		if data, ok := strings.CutPrefix(line, "data: "); ok {
			out = append(out, data)
		} else if line != "" && !strings.HasPrefix(line, ":") {
			t.Fatalf("not an SSE data line: %q in\n%s", line, stream)
		}
	}
	return out
}

func getString(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	must.NoError(t, err)
	defer resp.Body.Close()
	return readAllString(t, resp)
}

// proxyTo relays a recorded request to a real engine.
func proxyTo(target string) func(http.ResponseWriter, *http.Request, map[string]any) {
	return func(w http.ResponseWriter, r *http.Request, body map[string]any) {
		data, _ := json.Marshal(body)
		resp, err := http.Post("http://"+target+r.URL.Path, "application/json", strings.NewReader(string(data)))
		if err != nil {
			writeError(w, 502, "server_error", "x", "", err.Error(), 0)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 4096)
		for {
			n, err := resp.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			w.(http.Flusher).Flush()
			if err != nil {
				return
			}
		}
	}
}

func TestSGLangPairLegs(t *testing.T) {
	// Each leg waits until both arrived: they are sent at once.
	arrived := make(chan struct{})
	var seen sync.WaitGroup
	seen.Add(2)
	go func() { seen.Wait(); close(arrived) }()
	both := func(next func(http.ResponseWriter, *http.Request, map[string]any)) func(http.ResponseWriter, *http.Request, map[string]any) {
		return func(w http.ResponseWriter, r *http.Request, b map[string]any) {
			seen.Done()
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				writeError(w, 500, "server_error", "x", "", "the other leg never came", 0)
				return
			}
			next(w, r, b)
		}
	}
	p := newPDEngine(t, both(func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, tokenChunk("prefill-only")+"data: [DONE]\n\n")
	}))
	d := newPDEngine(t, both(streamDecode))
	h := pdHarness(t, pdDoc(),
		pdInstance("p1", addr(p.srv), "prefill", "sglang", discovery.MetaBootstrapPort, "8998"),
		pdInstance("d1", addr(d.srv), "decode", "sglang"))
	resp := h.post("/v1/completions", pdStreamBody, "X-Request-Id", "req-7")
	must.Eq(t, 200, resp.StatusCode)
	out := readAllString(t, resp)
	must.StrContains(t, out, `"llo"`)
	must.StrNotContains(t, out, "prefill-only")

	pl, dl := p.got(), d.got()
	must.SliceLen(t, 1, pl)
	must.SliceLen(t, 1, dl)
	for _, l := range []leg{pl[0], dl[0]} {
		must.Eq(t, "127.0.0.1", l.body["bootstrap_host"])
		must.Eq(t, 8998.0, l.body["bootstrap_port"])
		must.Eq(t, true, l.body["stream"])
		must.Eq(t, 8.0, l.body["max_tokens"])
		must.Eq(t, "req-7", l.reqID)
		must.MapNotContainsKey(t, l.body, "kv_transfer_params")
	}
	must.Eq(t, pl[0].body["bootstrap_room"], dl[0].body["bootstrap_room"])
	must.Eq(t, 1.0, disaggPath(h, "pair"))
}

func TestSGLangPrefillFailureRetriesAnotherPrefill(t *testing.T) {
	bad := newPDEngine(t, failWith(500))
	good := newPDEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	// The decode engine waits for its KV until the router cancels it.
	d := newPDEngine(t, func(w http.ResponseWriter, r *http.Request, b map[string]any) {
		if b["bootstrap_port"] == 1.0 {
			freeze(r)
			return
		}
		streamDecode(w, r, b)
	})
	h := pdHarness(t, pdDoc(),
		pdInstance("p-bad", addr(bad.srv), "prefill", "sglang", discovery.MetaBootstrapPort, "1"),
		pdInstance("p-good", addr(good.srv), "prefill", "sglang", discovery.MetaBootstrapPort, "2"),
		pdInstance("d1", addr(d.srv), "decode", "sglang"))
	busy(h, "p-good") // p-bad is chosen first
	resp := h.post("/v1/completions", pdStreamBody)
	must.Eq(t, 200, resp.StatusCode)
	must.StrContains(t, readAllString(t, resp), `"llo"`)
	must.SliceLen(t, 1, bad.got())
	// The prefill leg is sent next to the decode leg, which here does not wait for it.
	testutil.Eventually(t, 5*time.Second, "the second prefill leg", func() bool { return len(good.got()) == 1 })
	// The first decode leg may be cancelled before it reached the engine, or
	// reach it after the second (each leg has its connection): the second is
	// the one for p-good's bootstrap port, whatever the order.
	var last map[string]any
	for _, l := range d.got() {
		if l.body["bootstrap_port"] == 2.0 {
			must.Nil(t, last, must.Sprint("one decode leg for p-good"))
			last = l.body
		}
	}
	must.NotNil(t, last, must.Sprintf("no decode leg for p-good in %v", d.got()))
	must.Eq(t, good.got()[0].body["bootstrap_room"], last["bootstrap_room"])
	must.NotEq(t, bad.got()[0].body["bootstrap_room"], last["bootstrap_room"])
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.DisaggFailures.WithLabelValues("m", "prefill")))
}

// TestPrefillFailures: a failed prefill leg moves to another prefill
// worker, then, when the policy allows, the request is served without a
// remote prefill.
func TestPrefillFailures(t *testing.T) {
	none := func(d *policy.Document) { s := policy.FallbackNone; d.DisaggregationFallback = &s }
	short := func(d *policy.Document) { s := "300ms"; d.Timeouts.ResponseHeader = &s }
	hang := func(_ http.ResponseWriter, r *http.Request, _ map[string]any) { freeze(r) }
	noKV := func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"kv_transfer_params":null}`)
	}
	cases := []struct {
		name     string
		first    func(http.ResponseWriter, *http.Request, map[string]any) // nil: the address is dead
		second   func(http.ResponseWriter, *http.Request, map[string]any)
		both     bool // an aggregated worker exists
		opts     []func(*policy.Document)
		status   int
		served   string // "decode-kv" (pair), "decode-local" or "both"
		failures float64
	}{
		{"down then retried", nil, vllmPrefill, false, nil, 200, "decode-kv", 1},
		{"500 then retried", failWith(500), vllmPrefill, false, nil, 200, "decode-kv", 1},
		{"no kv_transfer_params then retried", noKV, vllmPrefill, false, nil, 200, "decode-kv", 1},
		{"timeout then retried", hang, vllmPrefill, false, []func(*policy.Document){short}, 200, "decode-kv", 1},
		{"all fail: decode prefills locally", failWith(503), failWith(500), false, nil, 200, "decode-local", 2},
		{"all fail: aggregated worker", nil, failWith(500), true, nil, 200, "both", 2},
		{"all time out: aggregated worker", hang, hang, true, []func(*policy.Document){short}, 200, "both", 2},
		{"all fail, no fallback", failWith(500), failWith(500), true, []func(*policy.Document){none}, 502, "", 2},
		{"all down, no fallback", nil, nil, false, []func(*policy.Document){none}, 503, "", 2},
		{"client error is the answer", failWith(400), vllmPrefill, false, nil, 400, "", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			address := func(f func(http.ResponseWriter, *http.Request, map[string]any)) (string, *pdEngine) {
				if f == nil {
					return deadAddr(t), nil
				}
				e := newPDEngine(t, f)
				return addr(e.srv), e
			}
			a1, _ := address(tc.first)
			a2, _ := address(tc.second)
			d := newPDEngine(t, streamDecode)
			agg := newPDEngine(t, streamDecode)
			ins := []discovery.Instance{pdInstance("p1", a1, "prefill", "vllm"), pdInstance("p2", a2, "prefill", "vllm"),
				pdInstance("d1", addr(d.srv), "decode", "vllm")}
			if tc.both {
				ins = append(ins, pdInstance("b1", addr(agg.srv), "both", "vllm"))
			}
			h := pdHarness(t, pdDoc(tc.opts...), ins...)
			busy(h, "p2") // p1 is chosen first
			if tc.both {
				busy(h, "d1") // a fallback goes to the aggregated worker
			}
			resp := h.post("/v1/completions", pdStreamBody)
			must.Eq(t, tc.status, resp.StatusCode)
			out := readAllString(t, resp)
			switch tc.served {
			case "decode-kv":
				must.SliceLen(t, 1, d.got())
				must.Eq(t, kvAnswer, d.got()[0].body["kv_transfer_params"].(map[string]any))
			case "decode-local":
				must.SliceLen(t, 1, d.got())
				must.MapNotContainsKey(t, d.got()[0].body, "kv_transfer_params")
				must.Eq(t, 1.0, disaggPath(h, "fallback"))
			case "both":
				must.SliceLen(t, 0, d.got())
				must.SliceLen(t, 1, agg.got())
				must.MapNotContainsKey(t, agg.got()[0].body, "kv_transfer_params")
				must.Eq(t, 1.0, disaggPath(h, "fallback"))
			default:
				must.SliceLen(t, 0, d.got())
				must.SliceLen(t, 0, agg.got())
			}
			if tc.status == 200 {
				must.StrContains(t, out, `"llo"`)
			}
			must.Eq(t, tc.failures, promtest.ToFloat64(h.m.DisaggFailures.WithLabelValues("m", "prefill")))
		})
	}
}

// TestDecodeFailures: a decode leg that fails before the first byte is
// retried once with a new pair; one that fails after is not retried.
func TestDecodeFailures(t *testing.T) {
	cut := func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, roleChunk+tokenChunk("he"))
		w.(http.Flusher).Flush()
		crash(w)
	}
	cases := []struct {
		name       string
		first      func(http.ResponseWriter, *http.Request, map[string]any) // nil: dead
		status     int
		secondHits int
		prefills   int
		body       string
	}{
		{"500 before the first byte", failWith(500), 200, 1, 2, `"llo"`},
		{"down", nil, 200, 1, 2, `"llo"`},
		{"broken after the first token", cut, 200, 0, 1, `"upstream_error"`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPDEngine(t, vllmPrefill)
			a1 := deadAddr(t)
			var d1 *pdEngine
			if tc.first != nil {
				d1 = newPDEngine(t, tc.first)
				a1 = addr(d1.srv)
			}
			d2 := newPDEngine(t, streamDecode)
			h := pdHarness(t, pdDoc(), pdInstance("p1", addr(p.srv), "prefill", "vllm"),
				pdInstance("d1", a1, "decode", "vllm"), pdInstance("d2", addr(d2.srv), "decode", "vllm"))
			busy(h, "d2") // d1 is chosen first
			resp := h.post("/v1/completions", pdStreamBody)
			must.Eq(t, tc.status, resp.StatusCode)
			must.StrContains(t, readAllString(t, resp), tc.body)
			must.SliceLen(t, tc.secondHits, d2.got())
			must.SliceLen(t, tc.prefills, p.got())
			if tc.secondHits > 0 {
				must.Eq(t, kvAnswer, d2.got()[0].body["kv_transfer_params"].(map[string]any))
				must.Eq(t, 1.0, promtest.ToFloat64(h.m.DisaggFailures.WithLabelValues("m", "decode")))
			}
		})
	}
}

// TestDecodeFailsAfterPrefillDied: a prefill engine that dies after
// answering its leg (vLLM) or after its response head (SGLang) makes the
// decode engine's KV pull fail, and the decode leg answers 500 before the
// first byte. The retry's new pair leaves out that prefill worker, and
// reuses the decode worker when it is the only one (found by
// test/e2e/disagg: SGLang requests failed with one decode worker).
func TestDecodeFailsAfterPrefillDied(t *testing.T) {
	sglangPrefill := func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	}
	vllmDeadPrefill := func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		kv := maps.Clone(kvAnswer)
		kv["remote_engine_id"] = "p-dead"
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{"choices": []any{}, "kv_transfer_params": kv})
	}
	// The decode engine fails every request whose KV is on the dead prefill engine.
	decode := func(w http.ResponseWriter, r *http.Request, b map[string]any) {
		kv, _ := b["kv_transfer_params"].(map[string]any)
		if b["bootstrap_port"] == 1.0 || (kv != nil && kv["remote_engine_id"] == "p-dead") {
			failWith(500)(w, r, b)
			return
		}
		streamDecode(w, r, b)
	}
	for _, tc := range []struct {
		name            string
		proto           string
		dead, good      func(http.ResponseWriter, *http.Request, map[string]any)
		decodes         int
		wantFirst       int // legs the first decode worker gets
		wantSecond      int
		wantGoodPrefill int
	}{
		{"sglang, one decode worker", "sglang", sglangPrefill, sglangPrefill, 1, 2, 0, 1},
		{"sglang, two decode workers", "sglang", sglangPrefill, sglangPrefill, 2, 1, 1, 1},
		{"vllm, one decode worker", "vllm", vllmDeadPrefill, vllmPrefill, 1, 2, 0, 1},
		{"vllm, two decode workers", "vllm", vllmDeadPrefill, vllmPrefill, 2, 1, 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dead, good := newPDEngine(t, tc.dead), newPDEngine(t, tc.good)
			d1, d2 := newPDEngine(t, decode), newPDEngine(t, decode)
			ins := []discovery.Instance{
				pdInstance("p-dead", addr(dead.srv), "prefill", tc.proto, discovery.MetaBootstrapPort, "1"),
				pdInstance("p-good", addr(good.srv), "prefill", tc.proto, discovery.MetaBootstrapPort, "2"),
				pdInstance("d1", addr(d1.srv), "decode", tc.proto)}
			if tc.decodes == 2 {
				ins = append(ins, pdInstance("d2", addr(d2.srv), "decode", tc.proto))
			}
			h := pdHarness(t, pdDoc(), ins...)
			busy(h, "p-good") // p-dead is chosen first, and again over a busy worker unless left out
			busy(h, "d2")     // d1 is chosen first
			resp := h.post("/v1/completions", pdStreamBody)
			must.Eq(t, 200, resp.StatusCode)
			must.StrContains(t, readAllString(t, resp), `"llo"`)
			must.SliceLen(t, tc.wantFirst, d1.got())
			must.SliceLen(t, tc.wantSecond, d2.got())
			testutil.Eventually(t, 5*time.Second, "the good prefill leg", func() bool { return len(good.got()) == tc.wantGoodPrefill })
			// The retry leaves the dead prefill worker out. (SGLang's legs run
			// at once: the decode leg's failure may cancel the prefill leg
			// before it reaches the dead engine.)
			if tc.proto == "vllm" {
				must.SliceLen(t, 1, dead.got())
			} else {
				must.LessEq(t, 1, len(dead.got()))
			}
			must.Eq(t, 1.0, promtest.ToFloat64(h.m.DisaggFailures.WithLabelValues("m", "decode")))
		})
	}
}

func TestDecodeFailsTwice(t *testing.T) {
	p := newPDEngine(t, vllmPrefill)
	d1, d2 := newPDEngine(t, failWith(500)), newPDEngine(t, failWith(503))
	h := pdHarness(t, pdDoc(), pdInstance("p1", addr(p.srv), "prefill", "vllm"),
		pdInstance("d1", addr(d1.srv), "decode", "vllm"), pdInstance("d2", addr(d2.srv), "decode", "vllm"))
	busy(h, "d2") // d1 is chosen first
	resp := h.post("/v1/completions", pdStreamBody)
	// The second decode leg's answer is the client's, as for direct requests.
	must.Eq(t, 503, resp.StatusCode)
	resp.Body.Close()
	must.SliceLen(t, 1, d1.got())
	must.SliceLen(t, 1, d2.got())
}

// TestDisaggDecision: short prompts, disaggregation off, and models
// without a compatible pair go to a direct worker.
func TestDisaggDecision(t *testing.T) {
	off := func(d *policy.Document) { s := policy.DisaggOff; d.Disaggregation = &s }
	high := func(d *policy.Document) { n := 10_000; d.DisaggregationMinUncachedTokens = &n }
	cases := []struct {
		name     string
		opts     []func(*policy.Document)
		prefillP string
		decodeP  string
		pair     bool
		path     string
	}{
		{"long prompt", nil, "vllm", "vllm", true, "pair"},
		{"below the threshold", []func(*policy.Document){high}, "vllm", "vllm", false, "direct"},
		{"off", []func(*policy.Document){off}, "vllm", "vllm", false, ""},
		{"no shared protocol", nil, "sglang", "vllm", false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := newPDEngine(t, vllmPrefill)
			d := newPDEngine(t, streamDecode)
			h := pdHarness(t, pdDoc(tc.opts...),
				pdInstance("p1", addr(p.srv), "prefill", tc.prefillP, discovery.MetaBootstrapPort, "9"),
				pdInstance("d1", addr(d.srv), "decode", tc.decodeP))
			resp := h.post("/v1/completions", pdStreamBody)
			must.Eq(t, 200, resp.StatusCode)
			resp.Body.Close()
			must.SliceLen(t, 1, d.got())
			if tc.pair {
				must.SliceLen(t, 1, p.got())
			} else {
				must.SliceLen(t, 0, p.got())
				must.MapNotContainsKey(t, d.got()[0].body, "kv_transfer_params")
			}
			for _, path := range []string{"pair", "direct", "fallback"} {
				want := 0.0
				if path == tc.path {
					want = 1
				}
				must.Eq(t, want, disaggPath(h, path), must.Sprint(path))
			}
		})
	}
}

// TestDisaggThresholdUsesDecodeCache: the threshold counts the prompt
// tokens the chosen decode worker does not hold, by the router's index.
func TestDisaggThresholdUsesDecodeCache(t *testing.T) {
	const prompt = 64 // tokens; 4 blocks of 16
	for _, tc := range []struct {
		name   string
		cached map[string]int // worker → blocks held
		pair   bool
	}{
		{"nothing cached", nil, true},
		{"decode worker holds the prompt", map[string]int{"d1": 4}, false},
		{"only the prefill worker holds it", map[string]int{"p1": 4}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPDEngine(t, vllmPrefill)
			d := newPDEngine(t, streamDecode)
			min := 32
			doc := pdDoc(func(d *policy.Document) { d.DisaggregationMinUncachedTokens = &min })
			h := pdHarnessCache(t, doc, fixedCache(tc.cached), prompt,
				pdInstance("p1", addr(p.srv), "prefill", "vllm"), pdInstance("d1", addr(d.srv), "decode", "vllm"))
			resp := h.post("/v1/completions", pdStreamBody)
			must.Eq(t, 200, resp.StatusCode)
			resp.Body.Close()
			if tc.pair {
				must.SliceLen(t, 1, p.got())
			} else {
				must.SliceLen(t, 0, p.got())
			}
		})
	}
}

func pdHarnessCache(t *testing.T, doc *policy.Document, src scoring.PrefixSource, promptTokens int, ins ...discovery.Instance) *harness {
	t.Helper()
	terms, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.CacheTerms(src)...)...)
	must.NoError(t, err)
	h := newHarnessWith(t, Config{MaxBodyBytes: 1 << 20, Prepare: func(r *scoring.Request) {
		r.Tokenize = func(context.Context, *scoring.Request) ([]uint32, error) { return make([]uint32, promptTokens), nil }
	}}, doc, map[string]string{})
	h.gw.cfg.Selector = scoring.NewSelector(scoring.SelectorConfig{Registry: terms})
	h.pool.Set(ins)
	return h
}

// fixedCache holds, per worker, a number of the prompt's first blocks.
type fixedCache map[string]int

func (fixedCache) Keys(dst []uint64, _ string, bs int, tokens []uint32) ([]uint64, error) {
	for i := 0; i+bs <= len(tokens); i += bs {
		dst = append(dst, uint64(i+1))
	}
	return dst, nil
}

func (c fixedCache) Match(keys []uint64, _ prefixindex.TierWeights, out []prefixindex.Match) []prefixindex.Match {
	for w, n := range c {
		out = append(out, prefixindex.Match{Worker: w, Blocks: min(n, len(keys)), Weighted: float64(min(n, len(keys)))})
	}
	return out
}

func TestCandidatesLeaveOutPrefillAndSGLangDecode(t *testing.T) {
	h := pdHarness(t, pdDoc(),
		pdInstance("p1", "127.0.0.1:1", "prefill", "vllm"),
		pdInstance("sd", "127.0.0.1:2", "decode", "sglang"),
		pdInstance("sp", "127.0.0.1:5", "prefill", "sglang", discovery.MetaBootstrapPort, "7"),
		pdInstance("vd", "127.0.0.1:3", "decode", "vllm"),
		pdInstance("b", "127.0.0.1:4", "both", "vllm"))
	var ids []string
	for _, w := range h.gw.candidates("m") {
		ids = append(ids, w.ID)
	}
	must.Eq(t, []string{"b", "vd"}, ids)
}

func TestSGLangDecodeFailureNewPair(t *testing.T) {
	p := newPDEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[]}`)
	})
	d1, d2 := newPDEngine(t, failWith(500)), newPDEngine(t, streamDecode)
	h := pdHarness(t, pdDoc(), pdInstance("p1", addr(p.srv), "prefill", "sglang", discovery.MetaBootstrapPort, "7"),
		pdInstance("d1", addr(d1.srv), "decode", "sglang"), pdInstance("d2", addr(d2.srv), "decode", "sglang"))
	busy(h, "d2") // d1 is chosen first
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`)
	must.Eq(t, 200, resp.StatusCode)
	must.StrContains(t, readAllString(t, resp), `"llo"`)
	must.SliceLen(t, 1, d1.got())
	must.SliceLen(t, 1, d2.got())
	room := d2.got()[0].body["bootstrap_room"]
	must.NotEq(t, d1.got()[0].body["bootstrap_room"], room)
	testutil.Eventually(t, 5*time.Second, "the new pair's prefill leg", func() bool {
		return slices.ContainsFunc(p.got(), func(l leg) bool { return l.body["bootstrap_room"] == room })
	})
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.DisaggFailures.WithLabelValues("m", "decode")))
}

// TestSGLangFallbackToAggregated: SGLang decode workers cannot prefill
// locally; a fallback goes to an aggregated worker, without bootstrap fields.
func TestSGLangFallbackToAggregated(t *testing.T) {
	p := newPDEngine(t, failWith(500))
	d := newPDEngine(t, func(_ http.ResponseWriter, r *http.Request, _ map[string]any) { freeze(r) }) // waits for KV
	agg := newPDEngine(t, streamDecode)
	h := pdHarness(t, pdDoc(), pdInstance("p1", addr(p.srv), "prefill", "sglang", discovery.MetaBootstrapPort, "7"),
		pdInstance("d1", addr(d.srv), "decode", "sglang"), pdInstance("b1", addr(agg.srv), "both", "sglang"))
	resp := h.post("/v1/completions", pdStreamBody)
	must.Eq(t, 200, resp.StatusCode)
	must.StrContains(t, readAllString(t, resp), `"llo"`)
	must.SliceLen(t, 1, agg.got())
	must.MapNotContainsKey(t, agg.got()[0].body, "bootstrap_room")
	must.Eq(t, 1.0, disaggPath(h, "fallback"))
}

func TestEmbeddingsAreNotDisaggregated(t *testing.T) {
	p := newPDEngine(t, vllmPrefill)
	d := newPDEngine(t, func(w http.ResponseWriter, _ *http.Request, _ map[string]any) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"data":[]}`)
	})
	h := pdHarness(t, pdDoc(), pdInstance("p1", addr(p.srv), "prefill", "vllm"), pdInstance("d1", addr(d.srv), "decode", "vllm"))
	resp := h.post("/v1/embeddings", `{"model":"m","input":"a long text"}`)
	must.Eq(t, 200, resp.StatusCode)
	resp.Body.Close()
	must.SliceLen(t, 0, p.got())
	must.SliceLen(t, 1, d.got())
}

func TestExchangeLegs(t *testing.T) {
	body := []byte(`{"model":"m"}`)
	x := &exchange{req: &scoring.Request{Body: body}, body: body}
	must.False(t, x.remotePrefill())
	must.True(t, x.leg([]byte(`{"model":"m","kv_transfer_params":{}}`)).remotePrefill())
	// Every request allocates one: the P/D fields must not push it past
	// its 256-byte size class (BenchmarkProxyStreaming's B/op).
	must.LessEq(t, uintptr(256), unsafe.Sizeof(exchange{}))
}
