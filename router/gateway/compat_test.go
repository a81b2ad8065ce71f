package gateway

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/auth"
)

// bodyEngine answers 200 {} and keeps the last body and headers it received.
type bodyEngine struct {
	*httptest.Server
	mu   sync.Mutex
	body []byte
	hdr  http.Header
	path string
}

func newBodyEngine(t *testing.T, answer func(w http.ResponseWriter, r *http.Request)) *bodyEngine {
	e := &bodyEngine{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.body, e.hdr, e.path = b, r.Header.Clone(), r.URL.Path
		e.mu.Unlock()
		if answer != nil {
			answer(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(e.Close)
	return e
}

func (e *bodyEngine) last() ([]byte, http.Header, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.body, e.hdr, e.path
}

// TestSingleModelDefault: a request naming no model goes to the pool's one
// model (vLLM's default), the model written into the body; with two models
// it is refused 400 as before.
func TestSingleModelDefault(t *testing.T) {
	e := newBodyEngine(t, nil)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e.Server)})
	for _, body := range []string{`{"prompt":"x"}`, `{ }`, `{"Model":"m"}`, `{"model":null,"prompt":"y"}`} {
		resp := h.post("/v1/completions", body)
		resp.Body.Close()
		must.Eq(t, 200, resp.StatusCode, must.Sprint(body))
		got, _, _ := e.last()
		var m struct{ Model string }
		must.NoError(t, json.Unmarshal(got, &m))
		must.Eq(t, "m", m.Model, must.Sprint(string(got)))
	}

	h.setEngines(map[string]string{"a": "m@" + addr(e.Server), "b": "n@" + addr(e.Server)})
	resp := h.post("/v1/completions", `{"prompt":"x"}`)
	must.Eq(t, 400, resp.StatusCode)
	e2 := readErr(t, resp)
	must.Eq(t, "model", *e2.Error.Param)
	must.Eq(t, "invalid_request", *e2.Error.Code)
}

// TestVLLMEndpointsProxied: vLLM's other model endpoints reach an engine
// serving the model the body names, at the same path, body unchanged;
// transcriptions by their multipart model field; /version from the
// engine first by id.
func TestVLLMEndpointsProxied(t *testing.T) {
	em := newBodyEngine(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"version":"0.9.9"}`))
	})
	en := newBodyEngine(t, nil)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(em.Server), "b": "n@" + addr(en.Server)})
	for _, p := range []string{"/tokenize", "/detokenize", "/v1/score", "/score", "/v1/rerank", "/rerank",
		"/pooling", "/classify", "/v1/embeddings"} {
		body := `{"model":"n","text_1":"a", "text_2":["b"]}`
		resp := h.post(p, body)
		resp.Body.Close()
		must.Eq(t, 200, resp.StatusCode, must.Sprint(p))
		got, _, path := en.last()
		must.Eq(t, p, path)
		must.Eq(t, body, string(got))
	}

	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write([]byte("RIFF....WAVEfmt "))
	_ = mw.WriteField("model", "m")
	_ = mw.Close()
	resp := h.post(TranscriptionsPath, buf.String(), "Content-Type", mw.FormDataContentType())
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	got, hdr, path := em.last()
	must.Eq(t, TranscriptionsPath, path)
	must.Eq(t, buf.String(), string(got))
	must.Eq(t, mw.FormDataContentType(), hdr.Get("Content-Type"))

	resp = h.post(TranscriptionsPath, "x", "Content-Type", "text/plain")
	must.Eq(t, 400, resp.StatusCode)
	must.Eq(t, "invalid_request", *readErr(t, resp).Error.Code)

	resp, err := http.Get(h.srv.URL + "/version")
	must.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	must.Eq(t, `{"version":"0.9.9"}`, string(b))
}

// TestWrongMethod: a wrong method on a known path is 405 with Allow (as
// vLLM); an unknown path stays 404.
func TestWrongMethod(t *testing.T) {
	e := newBodyEngine(t, nil)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e.Server)})
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/chat/completions", "POST"}, {"PUT", "/tokenize", "POST"},
		{"POST", "/v1/models", "GET"}, {"DELETE", "/version", "GET"},
	} {
		req, _ := http.NewRequest(c.method, h.srv.URL+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		must.NoError(t, err)
		must.Eq(t, 405, resp.StatusCode, must.Sprint(c))
		must.Eq(t, c.allow, resp.Header.Get("Allow"))
		must.Eq(t, "method_not_allowed", *readErr(t, resp).Error.Code)
	}
	resp, err := http.Get(h.srv.URL + "/v1/nope")
	must.NoError(t, err)
	must.Eq(t, 404, resp.StatusCode)
	must.Eq(t, "unknown_url", *readErr(t, resp).Error.Code)
}

// TestEngineErrorsInOpenAIShape: an engine's error answer reaches the
// client in OpenAI's shape, string code, its status and message kept.
func TestEngineErrorsInOpenAIShape(t *testing.T) {
	big := strings.Repeat("x", 100<<10)
	cases := []struct {
		name, ctype, body     string
		status                int
		msg, typ, code, param string
	}{
		{"llama.cpp", "application/json", `{"error":{"code":400,"message":"n_ctx exceeded","type":"invalid_request_error"}}`,
			400, "n_ctx exceeded", "invalid_request_error", "bad_request", ""},
		{"vLLM top level", "application/json", `{"object":"error","message":"no such model","type":"NotFoundError","param":"model","code":404}`,
			404, "no such model", "NotFoundError", "not_found", "model"},
		{"OpenAI", "application/json", `{"error":{"message":"slow down","type":"requests","param":null,"code":"rate_limit_exceeded"}}`,
			429, "slow down", "requests", "rate_limit_exceeded", ""},
		{"FastAPI detail", "application/json", `{"detail":"Not authenticated"}`,
			422, "Not authenticated", "invalid_request_error", "unprocessable_entity", ""},
		{"plain text 500", "text/plain", "Internal Server Error: boom\n",
			500, "Internal Server Error: boom", "server_error", "internal_server_error", ""},
		{"empty", "", "", 503, "the engine answered 503 Service Unavailable", "server_error", "service_unavailable", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			answer := func(w http.ResponseWriter, r *http.Request) {
				if c.ctype != "" {
					w.Header().Set("Content-Type", c.ctype)
				}
				w.WriteHeader(c.status)
				_, _ = io.WriteString(w, c.body)
			}
			// Two engines: a 5xx is retried once, then passed on.
			a, b := newBodyEngine(t, answer), newBodyEngine(t, answer)
			h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(a.Server), "b": "m@" + addr(b.Server)})
			resp := h.post("/v1/completions", `{"model":"m","prompt":"x"}`)
			must.Eq(t, c.status, resp.StatusCode)
			e := readErr(t, resp)
			must.Eq(t, c.msg, e.Error.Message)
			must.Eq(t, c.typ, e.Error.Type)
			must.Eq(t, c.code, *e.Error.Code)
			if c.param == "" {
				must.Nil(t, e.Error.Param)
			} else {
				must.Eq(t, c.param, *e.Error.Param)
			}
		})
	}
	t.Run("bounded", func(t *testing.T) {
		e := newBodyEngine(t, func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(400)
			_, _ = io.WriteString(w, big)
		})
		h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e.Server)})
		resp := h.post("/v1/completions", `{"model":"m","prompt":"x"}`)
		must.Eq(t, 400, resp.StatusCode)
		must.Less(t, 5<<10, len(readErr(t, resp).Error.Message))
	})
}

// TestCompression: engines are asked for identity encoding (so usage is
// counted), and a whole answer is gzipped toward a client that accepts it;
// a stream is not.
func TestCompression(t *testing.T) {
	const answer = `{"choices":[{"text":"hi"}],"usage":{"prompt_tokens":3,"completion_tokens":7,"total_tokens":10}}`
	e := newBodyEngine(t, func(w http.ResponseWriter, r *http.Request) {
		if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			// What a compressing engine does when the client's field reaches it.
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			_, _ = io.WriteString(gz, answer)
			_ = gz.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, answer)
	})
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e.Server)})
	raw := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	t.Cleanup(raw.CloseIdleConnections)
	do := func(body, enc string) *http.Response {
		req, _ := http.NewRequest(http.MethodPost, h.srv.URL+"/v1/completions", strings.NewReader(body))
		req.Header.Set("Accept-Encoding", enc)
		resp, err := raw.Do(req)
		must.NoError(t, err)
		return resp
	}

	resp := do(`{"model":"m","prompt":"x"}`, "gzip, deflate")
	must.Eq(t, 200, resp.StatusCode)
	must.Eq(t, "gzip", resp.Header.Get("Content-Encoding"))
	zr, err := gzip.NewReader(resp.Body)
	must.NoError(t, err)
	b, err := io.ReadAll(zr)
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, answer, string(b))
	_, hdr, _ := e.last()
	must.Eq(t, "identity", hdr.Get("Accept-Encoding"))
	testutil.Eventually(t, 5*time.Second, "usage to be counted", func() bool {
		return promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "a", "completion")) == 7
	})

	for _, c := range [][2]string{{`{"model":"m","prompt":"x"}`, "gzip;q=0"}, {`{"model":"m","prompt":"x","stream":true}`, "gzip"}} {
		resp = do(c[0], c[1])
		b, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		must.Eq(t, "", resp.Header.Get("Content-Encoding"), must.Sprint(c))
		must.Eq(t, answer, string(b))
	}
}

// TestStreamUsageWithSim: a stream whose client asked no usage is counted
// (the router asks oasis-sim for it) and the client's stream has no usage
// event; a client that asked gets it.
func TestStreamUsageWithSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	s := testutil.StartSim(t, testutil.SimConfig{Bin: bin, Model: "m",
		Args: []string{"--host", "127.0.0.1", "--speed", "0", "--log-level", "warn"}})
	h := newHarnessWith(t, Config{MaxBodyBytes: 1 << 20}, nil, map[string]string{"a": "m@" + s.Addr})
	counted := func() float64 { return promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "a", "completion")) }
	for i, c := range []struct {
		body      string
		wantUsage bool
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`, false},
		{`{"model":"m","prompt":"hi","max_tokens":5,"stream":true,"stream_options":{"continuous_usage_stats":false}}`, false},
		{`{"model":"m","prompt":"hi","max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, true},
	} {
		path := "/v1/completions"
		if strings.Contains(c.body, "messages") {
			path = "/v1/chat/completions"
		}
		before := counted()
		resp := h.post(path, c.body)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.NoError(t, err)
		must.Eq(t, 200, resp.StatusCode)
		must.StrContains(t, string(b), "data: [DONE]")
		must.Eq(t, c.wantUsage, strings.Contains(string(b), `"choices":[]`), must.Sprint(i, string(b)))
		testutil.Eventually(t, 5*time.Second, "the stream's tokens to be counted", func() bool { return counted() == before+5 })
	}
}

// TestStripUsageSplit: a usage event split between two reads is still
// taken out, the events around it kept.
func TestStripUsageSplit(t *testing.T) {
	stream := "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\n" +
		"data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":1,\"completion_tokens\":2}}\n\n" +
		"data: [DONE]\n\n"
	for cut := 1; cut < len(stream); cut++ {
		rl := &relay{strip: true}
		var out []byte
		for _, part := range []string{stream[:cut], stream[cut:]} {
			out = append(out, rl.stripUsage([]byte(part))...)
		}
		out = append(out, rl.partial...)
		must.Eq(t, "data: {\"choices\":[{\"text\":\"a\"}],\"usage\":null}\n\ndata: [DONE]\n\n", string(out), must.Sprint(cut))
	}
}

// TestLargeAnswerUsage: an answer over 1 MiB is counted too.
func TestLargeAnswerUsage(t *testing.T) {
	var u usageScanner
	u.feed([]byte(`{"choices":[{"text":"` + strings.Repeat("y", 3<<20) + `"}],`))
	u.feed([]byte(`"usage" : {"prompt_tokens":4,"completion_tokens":9,"total_tokens":13}}`))
	p, c, ok := u.result()
	must.True(t, ok)
	must.Eq(t, int64(4), p)
	must.Eq(t, int64(9), c)
}

// TestModelsWithSim: /v1/models in vLLM's shape, the engine's created and
// max_model_len, cascade aliases listed, byte for byte the same from two
// router replicas; /v1/models/{id}, 404 for an unknown one.
func TestModelsWithSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	s := testutil.StartSim(t, testutil.SimConfig{Bin: bin, Model: "org/m",
		Args: []string{"--host", "127.0.0.1", "--speed", "0", "--log-level", "warn"}})
	doc := parseDoc(t, `{"policy":"round_robin","cascades":{"alias":{"small":"org/m","large":"org/big","gate":"logprob","threshold":-0.5}}}`)
	engines := map[string]string{"a": "org/m@" + s.Addr}
	get := func(h *harness, path string) (int, string) {
		resp, err := http.Get(h.srv.URL + path)
		must.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		must.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	h1 := newHarness(t, doc, nil, engines)
	status, list := get(h1, "/v1/models")
	must.Eq(t, 200, status)
	var got struct {
		Data []map[string]any `json:"data"`
	}
	must.NoError(t, json.Unmarshal([]byte(list), &got))
	must.Len(t, 2, got.Data)
	m, alias := got.Data[0], got.Data[1]
	must.Eq(t, "org/m", m["id"])
	must.Eq(t, "model", m["object"])
	must.NotEq(t, 0.0, m["created"].(float64))
	must.Positive(t, m["max_model_len"].(float64))
	must.Eq(t, "org/m", m["root"])
	must.Nil(t, m["parent"])
	must.Eq(t, []any{}, m["permission"].([]any))
	must.Eq(t, "alias", alias["id"])

	h2 := newHarness(t, doc, nil, engines) // another replica
	_, list2 := get(h2, "/v1/models")
	must.Eq(t, list, list2)

	status, one := get(h1, "/v1/models/org/m")
	must.Eq(t, 200, status)
	must.StrContains(t, one, `"max_model_len":`)
	resp, err := http.Get(h1.srv.URL + "/v1/models/nope")
	must.NoError(t, err)
	must.Eq(t, 404, resp.StatusCode)
	must.Eq(t, "model_not_found", *readErr(t, resp).Error.Code)
}

// TestCORS: with origins configured, a preflight is answered by the router
// (before authentication) and answers carry Allow-Origin; other origins
// get no CORS headers and a refused preflight; without the option, none.
func TestCORS(t *testing.T) {
	e := newBodyEngine(t, nil)
	sum := sha256.Sum256([]byte("sk-test-1"))
	specs, err := auth.Parse([]byte(`{"keys":[{"id":"k","sha256":"` + hex.EncodeToString(sum[:]) + `"}]}`))
	must.NoError(t, err)
	authn := auth.New()
	authn.Set(specs)
	h := newHarnessWith(t, Config{Auth: authn, CORS: &CORS{Origins: []string{"https://app.example"}}}, nil,
		map[string]string{"a": "m@" + addr(e.Server)})
	preflight := func(srv string, origin string) *http.Response {
		req, _ := http.NewRequest(http.MethodOptions, srv+"/v1/chat/completions", nil)
		req.Header.Set("Origin", origin)
		req.Header.Set("Access-Control-Request-Method", "POST")
		req.Header.Set("Access-Control-Request-Headers", "authorization, content-type")
		resp, err := http.DefaultClient.Do(req)
		must.NoError(t, err)
		resp.Body.Close()
		return resp
	}
	resp := preflight(h.srv.URL, "https://app.example")
	must.Eq(t, 204, resp.StatusCode)
	must.Eq(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))
	must.Eq(t, "GET, POST", resp.Header.Get("Access-Control-Allow-Methods"))
	must.StrContains(t, resp.Header.Get("Access-Control-Allow-Headers"), "Authorization")

	resp = h.post("/v1/chat/completions", `{"model":"m","messages":[]}`, "Origin", "https://app.example",
		"Authorization", "Bearer sk-test-1")
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	must.Eq(t, "https://app.example", resp.Header.Get("Access-Control-Allow-Origin"))

	must.Eq(t, 403, preflight(h.srv.URL, "https://evil.example").StatusCode)
	resp = h.post("/v1/chat/completions", `{"model":"m","messages":[]}`, "Origin", "https://evil.example",
		"Authorization", "Bearer sk-test-1")
	resp.Body.Close()
	must.Eq(t, "", resp.Header.Get("Access-Control-Allow-Origin"))

	off := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e.Server)})
	resp = preflight(off.srv.URL, "https://app.example")
	must.Eq(t, 405, resp.StatusCode)
	must.Eq(t, "", resp.Header.Get("Access-Control-Allow-Origin"))
}

// TestModelsLlamaServerContext: llama-server's /v1/models has no
// max_model_len; the card takes its meta.n_ctx (a slot's context).
func TestModelsLlamaServerContext(t *testing.T) {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `{"models":[{"name":"tiny","model":"tiny"}],"object":"list","data":[{"id":"tiny","aliases":["tiny"],`+
			`"object":"model","created":1795926507,"owned_by":"llamacpp","meta":{"n_vocab":128256,"n_ctx":1024,"n_ctx_train":4096}}]}`)
	}))
	t.Cleanup(e.Close)
	h := newHarness(t, nil, nil, map[string]string{"a": "tiny@" + addr(e)})
	resp := h.do(http.MethodGet, "/v1/models/tiny")
	defer resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	var card modelCard
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&card))
	must.NotNil(t, card.MaxModelLen)
	must.Eq(t, int64(1024), *card.MaxModelLen)
	must.Eq(t, int64(1795926507), card.Created)
}
