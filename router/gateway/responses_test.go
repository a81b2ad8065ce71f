package gateway

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// respEngine stores responses in memory under the request_id it is sent,
// as vLLM's serving_responses does, and answers with its name.
type respEngine struct {
	*httptest.Server
	name   string
	mu     sync.Mutex
	stored map[string]bool
	bodies [][]byte
}

func newRespEngine(t *testing.T, name string) *respEngine {
	e := &respEngine{name: name, stored: map[string]bool{}}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/responses", e.create)
	mux.HandleFunc("GET /v1/responses/{id}", func(w http.ResponseWriter, r *http.Request) {
		if !e.has(r.PathValue("id")) {
			e.notFound(w, r.PathValue("id"))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"object":"response","engine":%q,"query":%q}`, r.PathValue("id"), e.name, r.URL.RawQuery)
	})
	mux.HandleFunc("POST /v1/responses/{id}/cancel", func(w http.ResponseWriter, r *http.Request) {
		if !e.has(r.PathValue("id")) {
			e.notFound(w, r.PathValue("id"))
			return
		}
		w.WriteHeader(http.StatusBadRequest)
		_, _ = w.Write([]byte(`{"error":{"message":"Cannot cancel a synchronous response.","type":"invalid_request_error","param":null,"code":400}}`))
	})
	e.Server = httptest.NewServer(mux)
	t.Cleanup(e.Close)
	return e
}

func (e *respEngine) has(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stored[id]
}

func (e *respEngine) notFound(w http.ResponseWriter, id string) {
	w.WriteHeader(http.StatusNotFound)
	fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":null,"code":404}}`, id)
}

func (e *respEngine) create(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var req struct {
		RequestID string  `json:"request_id"`
		Prev      *string `json:"previous_response_id"`
		Stream    bool    `json:"stream"`
	}
	if err := json.Unmarshal(b, &req); err != nil || req.RequestID == "" {
		http.Error(w, "no request_id", http.StatusBadRequest)
		return
	}
	if req.Prev != nil && !e.has(*req.Prev) {
		e.notFound(w, *req.Prev)
		return
	}
	e.mu.Lock()
	e.stored[req.RequestID] = true
	e.bodies = append(e.bodies, b)
	e.mu.Unlock()
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q}}\n\n", req.RequestID)
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q,\"engine\":%q,"+
			"\"usage\":{\"input_tokens\":5,\"output_tokens\":3,\"total_tokens\":8}}}\n\n", req.RequestID, e.name)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"id":%q,"object":"response","engine":%q,"usage":{"input_tokens":4,"output_tokens":2,"total_tokens":6}}`,
		req.RequestID, e.name)
}

func (e *respEngine) lastBody() []byte {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.bodies[len(e.bodies)-1]
}

type respAnswer struct {
	ID     string `json:"id"`
	Engine string `json:"engine"`
	Query  string `json:"query"`
}

func decodeResp(t *testing.T, resp *http.Response) respAnswer {
	t.Helper()
	defer resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	var a respAnswer
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&a))
	return a
}

func (h *harness) do(method, path string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, nil)
	must.NoError(h.t, err)
	resp, err := http.DefaultClient.Do(req)
	must.NoError(h.t, err)
	return resp
}

var testRespKey = bytes.Repeat([]byte("k"), MinResponseIDKey)

// TestResponsesAffinity: every response id the router hands out leads back
// to the engine that stored it, on another router replica sharing the key
// too, for GET, cancel and previous_response_id, while a round-robin policy
// spreads new responses over both engines.
func TestResponsesAffinity(t *testing.T) {
	a, b := newRespEngine(t, "a"), newRespEngine(t, "b")
	engines := map[string]string{"inst-a": "m@" + addr(a.Server), "inst-b": "m@" + addr(b.Server)}
	h1 := newHarnessWith(t, Config{ResponseIDKey: testRespKey}, nil, engines)
	h2 := newHarnessWith(t, Config{ResponseIDKey: testRespKey}, nil, engines)

	by := map[string]int{}
	for i := 0; i < 6; i++ {
		created := decodeResp(t, h1.post(ResponsesPath, `{"model":"m","input":"hi","request_id":"resp_mine"}`))
		must.StrHasPrefix(t, "resp_", created.ID)
		must.NotEq(t, "resp_mine", created.ID) // the client's request_id is overridden
		by[created.Engine]++
		for _, h := range []*harness{h1, h2} {
			got := decodeResp(t, h.do(http.MethodGet, ResponsesPath+"/"+created.ID+"?stream=false"))
			must.Eq(t, created.Engine, got.Engine)
			must.Eq(t, created.ID, got.ID)
			must.Eq(t, "stream=false", got.Query)
		}
		next := decodeResp(t, h2.post(ResponsesPath, `{"model":"m","input":"more","previous_response_id":"`+created.ID+`"}`))
		must.Eq(t, created.Engine, next.Engine, must.Sprint("previous_response_id went to another engine"))

		resp := h2.post(ResponsesPath+"/"+created.ID+"/cancel", "")
		must.Eq(t, http.StatusBadRequest, resp.StatusCode)
		e := readErr(t, resp)
		must.Eq(t, "Cannot cancel a synchronous response.", e.Error.Message)
	}
	must.Eq(t, map[string]int{"a": 3, "b": 3}, by)
}

// TestResponsesUnknownIDs: ids the router did not mint with its key, and
// ids of an engine no longer in the pool, are 404 response_not_found
// without reaching any engine.
func TestResponsesUnknownIDs(t *testing.T) {
	a := newRespEngine(t, "a")
	h := newHarnessWith(t, Config{ResponseIDKey: testRespKey}, nil, map[string]string{"inst-a": "m@" + addr(a.Server)})
	other, err := newResponseIDs(bytes.Repeat([]byte("x"), MinResponseIDKey))
	must.NoError(t, err)
	forged, err := other.mint("inst-a")
	must.NoError(t, err)
	good := decodeResp(t, h.post(ResponsesPath, `{"model":"m","input":"hi"}`)).ID
	tampered := good[:len(good)-2] + "AA"
	if tampered == good {
		tampered = good[:len(good)-2] + "BB"
	}
	gone, err := h.gw.respIDs.mint("inst-gone")
	must.NoError(t, err)

	for _, id := range []string{forged, tampered, gone, "resp_" + strings.Repeat("A", 600), "resp_abc", "chatcmpl-1"} {
		resp := h.do(http.MethodGet, ResponsesPath+"/"+id)
		must.Eq(t, http.StatusNotFound, resp.StatusCode, must.Sprint(id))
		must.Eq(t, "response_not_found", *readErr(t, resp).Error.Code)
	}
	for _, id := range []string{forged, tampered, "resp_abc"} {
		resp := h.post(ResponsesPath, `{"model":"m","input":"x","previous_response_id":"`+id+`"}`)
		must.Eq(t, http.StatusNotFound, resp.StatusCode)
		e := readErr(t, resp)
		must.Eq(t, "previous_response_id", *e.Error.Param)
	}
	resp := h.post(ResponsesPath, `{"model":"m","input":"x","previous_response_id":"`+gone+`"}`)
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	must.Eq(t, "response_not_found", *readErr(t, resp).Error.Code)

	// A replica without the key (a random one per process) knows none of them.
	h3 := newHarnessWith(t, Config{}, nil, map[string]string{"inst-a": "m@" + addr(a.Server)})
	resp = h3.do(http.MethodGet, ResponsesPath+"/"+good)
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	resp.Body.Close()
}

// TestResponsesStream: a streamed create passes the engine's events
// through, carrying the id the router minted, which GET finds again.
func TestResponsesStream(t *testing.T) {
	a := newRespEngine(t, "a")
	h := newHarnessWith(t, Config{ResponseIDKey: testRespKey}, nil, map[string]string{"inst-a": "m@" + addr(a.Server)})
	resp := h.post(ResponsesPath, `{"model":"m","input":"hi","stream":true}`)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.StrHasPrefix(t, "text/event-stream", resp.Header.Get("Content-Type"))
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.NoError(t, err)
	var sent struct {
		RequestID string `json:"request_id"`
	}
	must.NoError(t, json.Unmarshal(a.lastBody(), &sent))
	must.StrContains(t, string(b), "event: response.completed")
	must.StrContains(t, string(b), `"id":"`+sent.RequestID+`"`)
	must.Eq(t, "a", decodeResp(t, h.do(http.MethodGet, ResponsesPath+"/"+sent.RequestID)).Engine)

	// Usage of both answers (input_tokens/output_tokens) is counted.
	decodeResp(t, h.post(ResponsesPath, `{"model":"m","input":"hi"}`))
	testutil.Eventually(t, 5*time.Second, "the responses' tokens counted", func() bool {
		return promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "inst-a", "prompt")) == 9 &&
			promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "inst-a", "completion")) == 5
	})
}

// TestWrongMethodOnItemPaths: a wrong method on /v1/models/{id} and the
// Responses API's item paths is 405 with Allow, as vLLM answers.
func TestWrongMethodOnItemPaths(t *testing.T) {
	h := newHarnessWith(t, Config{}, nil, map[string]string{"a": "m@" + deadAddr(t)})
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodDelete, "/v1/models/m", "GET"},
		{http.MethodPost, "/v1/models/org/m", "GET"},
		{http.MethodDelete, ResponsesPath + "/resp_x", "GET"},
		{http.MethodGet, ResponsesPath + "/resp_x/cancel", "POST"},
		{http.MethodGet, ResponsesPath, "POST"},
	} {
		resp := h.do(tc.method, tc.path)
		must.Eq(t, http.StatusMethodNotAllowed, resp.StatusCode, must.Sprint(tc))
		must.Eq(t, tc.allow, resp.Header.Get("Allow"), must.Sprint(tc))
		must.Eq(t, "method_not_allowed", *readErr(t, resp).Error.Code)
	}
	resp := h.do(http.MethodGet, "/v1/nothing/here")
	must.Eq(t, http.StatusNotFound, resp.StatusCode)
	resp.Body.Close()
}

func TestResponseIDs(t *testing.T) {
	_, err := newResponseIDs([]byte("short"))
	must.Error(t, err)
	ids, err := newResponseIDs(testRespKey)
	must.NoError(t, err)
	long := strings.Repeat("i", maxInstanceID)
	for _, inst := range []string{"a", "_nomad-task-0c1d-group-engine-vllm-http", long} {
		id, err := ids.mint(inst)
		must.NoError(t, err)
		got, err := ids.open(id)
		must.NoError(t, err)
		must.Eq(t, inst, got)
	}
	_, err = ids.mint(long + "x")
	must.Error(t, err)
	_, err = ids.mint("")
	must.Error(t, err)
	for _, bad := range []string{"", "resp_", "resp_!!", "resp_AAAA", "x_" + strings.Repeat("A", 40)} {
		_, err := ids.open(bad)
		must.ErrorIs(t, err, ErrResponseID, must.Sprint(bad))
	}
}

// TestStoredResponseTimeouts: GET of a stored response is bounded by the
// model's response_header timeout (504 upstream_timeout) and, once the
// answer streams, by stream_idle (the relay ends).
func TestStoredResponseTimeouts(t *testing.T) {
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("stream") == "true" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = w.Write([]byte("event: response.created\ndata: {}\n\n"))
			w.(http.Flusher).Flush()
		}
		select { // silent until the test ends or the router gives up
		case <-release:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(e.Close)
	h := newHarnessWith(t, Config{ResponseIDKey: testRespKey}, timeouts("300ms", "300ms", "auto"),
		map[string]string{"inst-a": "m@" + addr(e)})
	id, err := h.gw.respIDs.mint("inst-a")
	must.NoError(t, err)

	t0 := time.Now()
	resp := h.do(http.MethodGet, ResponsesPath+"/"+id)
	must.Eq(t, http.StatusGatewayTimeout, resp.StatusCode)
	must.Eq(t, "upstream_timeout", *readErr(t, resp).Error.Code)
	must.Less(t, 5*time.Second, time.Since(t0))

	resp = h.do(http.MethodGet, ResponsesPath+"/"+id+"?stream=true")
	must.Eq(t, http.StatusOK, resp.StatusCode)
	b, _ := io.ReadAll(resp.Body) // ends when the router drops the silent stream
	resp.Body.Close()
	must.StrContains(t, string(b), "response.created")
	must.Less(t, 10*time.Second, time.Since(t0))
}
