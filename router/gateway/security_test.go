package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/federation"
)

// Issue #33 (second security audit): routing loops (item 1), client
// disaggregation fields (item 3), client X-Oasis-* and Authorization
// headers (low).

// seenRequest is what a recording engine received.
type seenRequest struct {
	header http.Header
	body   string
}

// recordingEngine answers every request with a short JSON completion and
// sends what it received on the returned channel.
func recordingEngine(t *testing.T) (*httptest.Server, <-chan seenRequest) {
	seen := make(chan seenRequest, 16)
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		seen <- seenRequest{header: r.Header.Clone(), body: string(b)}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(e.Close)
	return e, seen
}

// disaggBody carries every member of the router's disaggregation protocol.
const disaggBody = `{"model":"m", "messages":[{"role":"user","content":"a <b> & c"}],` +
	`"kv_transfer_params":{"do_remote_prefill":true,"remote_engine_id":"victim","remote_host":"10.0.0.9","remote_port":5600,"remote_block_ids":[1,2,3]},` +
	`"bootstrap_host":"10.0.0.9","bootstrap_port":8998,"bootstrap_room":42,"bootstrap_pair_key":"k","max_tokens":4}`

// disaggStripped is disaggBody as engines must see it: the other members
// byte for byte.
const disaggStripped = `{"model":"m","messages":[{"role":"user","content":"a <b> & c"}],"max_tokens":4}`

// Item 3: a client's kv_transfer_params and bootstrap_* never reach an
// engine (direct path; the federated path is in
// TestFederatedHopCarriesNoClientFields); a body without them is forwarded
// byte for byte as before.
func TestClientDisaggFieldsStripped(t *testing.T) {
	e, seen := recordingEngine(t)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})

	resp := h.post("/v1/chat/completions", disaggBody)
	readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, disaggStripped, (<-seen).body)

	plain := ` {"model":"m","messages":[{"role":"user","content":"a <b>"}] , "x":{"kv_transfer_params":1}}` + "\n"
	resp = h.post("/v1/chat/completions", plain)
	readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, plain, (<-seen).body)
}

// Low: the client's X-Oasis-* fields and, with API keys off, its
// Authorization stay at the router; other end-to-end fields pass, and the
// engine sees this router's Via mark.
func TestEngineGetsNoClientOasisFieldsOrAuthorization(t *testing.T) {
	e, seen := recordingEngine(t)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})
	resp := h.post("/v1/chat/completions", chatM, "Authorization", "Bearer client-secret",
		DeadlineHeader, "60000", "X-Oasis-Overflow", "queue_full", "x-oasis-anything", "1", "X-Custom", "kept")
	readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	got := (<-seen).header
	must.Eq(t, "", got.Get("Authorization"))
	for k := range got {
		must.False(t, isOasisField(k), must.Sprintf("engine got %s: %q", k, got[k]))
	}
	must.Eq(t, "kept", got.Get("X-Custom"))
	must.Eq(t, []string{"1.1 " + h.gw.hop.id}, got["Via"])
}

// Item 1 (b): a request carrying this router's Via mark came back to it
// and is refused with 508; so is one past MaxRouterHops routers. Other
// proxies' Via entries are kept and the router's appended.
func TestRequestCarryingOwnMarkRefused(t *testing.T) {
	e, seen := recordingEngine(t)
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + addr(e)})

	resp := h.post("/v1/chat/completions", chatM, "Via", "1.1 edge-proxy")
	readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	via := (<-seen).header["Via"]
	must.Eq(t, []string{"1.1 edge-proxy", "1.1 " + h.gw.hop.id}, via)

	// The engine's request sent to the router again.
	resp = h.post("/v1/chat/completions", chatM, "Via", strings.Join(via, ", "))
	must.Eq(t, http.StatusLoopDetected, resp.StatusCode)
	ae := readErr(t, resp)
	must.Eq(t, "loop_detected", *ae.Error.Code)
	must.StrContains(t, ae.Error.Message, "routing loop")
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.Loops.WithLabelValues("own_mark")))

	hops := strings.Repeat("1.1 oasis-router-0123456789abcdef, ", MaxRouterHops)
	resp = h.post("/v1/chat/completions", chatM, "Via", strings.TrimSuffix(hops, ", "))
	must.Eq(t, http.StatusLoopDetected, resp.StatusCode)
	readErr(t, resp)
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.Loops.WithLabelValues("hop_limit")))
	must.Eq(t, 0, len(seen)) // neither reached the engine
}

// Item 1 (b): a router that is its own engine, and two routers registered
// as each other's engines, answer one request with one 508 naming the
// loop instead of calling themselves until every connection is taken.
func TestRoutingLoopsEndAtOnce(t *testing.T) {
	t.Run("self", func(t *testing.T) {
		h := newHarness(t, nil, nil, nil)
		h.setEngines(map[string]string{"self": "m@" + addr(h.srv)})
		resp := h.post("/v1/chat/completions", chatM)
		must.Eq(t, http.StatusLoopDetected, resp.StatusCode)
		ae := readErr(t, resp)
		must.Eq(t, "loop_detected", *ae.Error.Code)
		must.Eq(t, 1.0, promtest.ToFloat64(h.m.Loops.WithLabelValues("own_mark")))
	})
	t.Run("two routers", func(t *testing.T) {
		a, b := newHarness(t, nil, nil, nil), newHarness(t, nil, nil, nil)
		a.setEngines(map[string]string{"b": "m@" + addr(b.srv)})
		b.setEngines(map[string]string{"a": "m@" + addr(a.srv)})
		resp := a.post("/v1/chat/completions", chatM)
		must.Eq(t, http.StatusLoopDetected, resp.StatusCode)
		ae := readErr(t, resp)
		must.StrContains(t, ae.Error.Message, "routing loop")
		must.Eq(t, 1.0, promtest.ToFloat64(a.m.Loops.WithLabelValues("own_mark")))
		must.Eq(t, 0.0, promtest.ToFloat64(b.m.Loops.WithLabelValues("own_mark")))
	})
}

// Items 1 and 3, federation: a request forwarded to another datacenter's
// router is served there (the hop mark is not a loop), and the engine
// there sees both routers' marks but none of the client's disaggregation
// members, X-Oasis-* fields or Authorization.
func TestFederatedHopCarriesNoClientFields(t *testing.T) {
	var hits atomic.Int64
	seen := make(chan seenRequest, 4)
	e2 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		b, _ := io.ReadAll(r.Body)
		seen <- seenRequest{header: r.Header.Clone(), body: string(b)}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","choices":[]}`)
	}))
	t.Cleanup(e2.Close)
	dc1, dc2 := fedPair(t, map[string]string{"x": "other@" + deadAddr(t)}, map[string]string{"b": "m@" + addr(e2)})
	testutil.Eventually(t, 10*time.Second, "dc2's summary for m to reach dc1", func() bool {
		return dc1.fed.Route(federation.Request{Model: "m"}).DC == "dc2" // dc2's summary for m arrived
	})
	resp := dc1.h.post("/v1/chat/completions", disaggBody, "Authorization", "Bearer client-secret", "X-Oasis-Probe", "1")
	body := readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
	must.Eq(t, 1, forwardedCount(t, dc1))
	got := <-seen
	must.Eq(t, disaggStripped, got.body)
	must.Eq(t, "", got.header.Get("Authorization"))
	for k := range got.header {
		must.False(t, isOasisField(k), must.Sprintf("engine got %s", k))
	}
	var via []string
	for _, v := range got.header["Via"] {
		via = append(via, strings.Split(v, ", ")...)
	}
	must.Eq(t, []string{"1.1 " + dc1.h.gw.hop.id, "3 " + dc2.h.gw.hop.id}, via, must.Sprint(got.header["Via"]))
	var ans map[string]any
	must.NoError(t, json.Unmarshal([]byte(body), &ans))
}
