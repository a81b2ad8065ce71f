package app

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/discovery"
)

// The approximate record learns only prompts an engine accepted: an engine
// that refuses every request (400, as for a prompt over its context) is not
// credited with them, so clients cannot grow the router's index with
// prompts no engine cached (issue #33, item 4). A second engine that
// accepts the same prompt is.
func TestDecisionsLearnOnlyAcceptedPrompts(t *testing.T) {
	refusing := refusingEngine(t)
	accepting := newEngine(t, 1, 0)
	cfg := baseConfig(t)
	cfg.Engines = []StaticEngine{
		{Model: "refused", Address: strings.TrimPrefix(refusing.URL, "http://"), Engine: "sim"},
		{Model: "accepted", Address: strings.TrimPrefix(accepting.URL, "http://"), Engine: "sim"},
	}
	cfg.PolicyFile = policyFile(t, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`)
	r := start(t, cfg)

	prompt := strings.Repeat("a long prompt the engine refuses every time it is sent ", 40)
	for range 2 {
		body := fmt.Sprintf(`{"model":"refused","prompt":%q}`, prompt)
		resp, err := http.Post(r.url("http")+"/v1/completions", "application/json", strings.NewReader(body))
		must.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		must.Eq(t, http.StatusBadRequest, resp.StatusCode)
	}
	requested, matched := prefixBlocks(t, cfg.Registry, "refused")
	must.Greater(t, 0, requested)
	must.Eq(t, 0.0, matched, must.Sprint("the refused prompt was learned"))
	must.Eq(t, 0, r.cache.ApproxIndex().Stats().Entries)

	for range 2 {
		completePrompt(t, r.url("http"), "accepted", prompt)
	}
	requested, matched = prefixBlocks(t, cfg.Registry, "accepted")
	must.Eq(t, requested/2, matched)
}

// A registration advertising 2^36 tokens per tier (the most discovery
// accepts), delivered to the pool as discovery delivers it, is modelled
// with -index-worker-max-blocks blocks at most, and the clamp is counted
// (issue #33, item 4).
func TestAdvertisedCapacityClamped(t *testing.T) {
	eng := newEngine(t, 1, 0)
	cfg := baseConfig(t, eng.URL)
	cfg.IndexWorkerMaxBlocks = 8
	cfg.PolicyFile = policyFile(t, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`)
	r := start(t, cfg)
	// The static list first, then what a discovery source would deliver.
	testutil.Eventually(t, 10*time.Second, "the static engine in the pool", func() bool {
		return len(r.Pool().Workers("m")) == 1
	})
	huge := "gpu=68719476736,cpu=68719476736,disk=68719476736"
	r.Pool().Set([]discovery.Instance{{ID: "huge", Address: strings.TrimPrefix(eng.URL, "http://"),
		Meta: map[string]string{"oasis_model": "m", "oasis_engine": "sim", "oasis_kv_capacity": huge}}})
	must.Eq(t, 1.0, promtest.ToFloat64(r.m.KVCapacityClamped))

	completePrompt(t, r.url("http"), "m", strings.Repeat("a prompt of many more blocks than the bound ", 40))
	requested, _ := prefixBlocks(t, cfg.Registry, "m")
	must.Greater(t, 8, requested)
	must.Eq(t, 8, r.cache.ApproxIndex().WorkerEntries("huge"))
}

// An engine with KV events is credited with a routing decision at once (an
// in-flight entry, before its events), and the credit is taken back when
// the engine refuses the request: a client cannot point other requests with
// a prefix at an engine that never computed it. An engine that accepts
// keeps its entry.
func TestInflightCreditTakenBackOnRefusal(t *testing.T) {
	refusing := refusingEngine(t)
	accepting := newEngine(t, 1, 0)
	cfg := baseConfig(t, accepting.URL)
	cfg.PolicyFile = policyFile(t, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`)
	r := start(t, cfg)
	// The static list first, then what a discovery source would deliver.
	testutil.Eventually(t, 10*time.Second, "the static engine in the pool", func() bool {
		return len(r.Pool().Workers("m")) == 1
	})
	// Event endpoints nobody publishes on: the engines are event-driven, their events never come.
	events := func() string { return "tcp://" + testutil.FreeAddr(t) }
	r.Pool().Set([]discovery.Instance{
		{ID: "refusing", Address: strings.TrimPrefix(refusing.URL, "http://"),
			Meta: map[string]string{"oasis_model": "refused", "oasis_engine": "sim", discovery.MetaKVEvents: events()}},
		{ID: "accepting", Address: strings.TrimPrefix(accepting.URL, "http://"),
			Meta: map[string]string{"oasis_model": "accepted", "oasis_engine": "sim", discovery.MetaKVEvents: events()}},
	})
	testutil.Eventually(t, 10*time.Second, "both engines event-driven in the cache state", func() bool {
		return r.cache.EventDriven("refusing") && r.cache.EventDriven("accepting")
	})

	prompt := strings.Repeat("a long prompt the engine refuses every time it is sent ", 40)
	body := fmt.Sprintf(`{"model":"refused","prompt":%q}`, prompt)
	resp, err := http.Post(r.url("http")+"/v1/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	must.Eq(t, http.StatusBadRequest, resp.StatusCode)
	must.Eq(t, 0, r.cache.InflightIndex().WorkerEntries("refusing"), must.Sprint("the refused prompt is still credited"))

	completePrompt(t, r.url("http"), "accepted", prompt)
	must.Positive(t, r.cache.InflightIndex().WorkerEntries("accepting"))
}

// refusingEngine answers every request 400, as an engine does a prompt over its context.
func refusingEngine(t *testing.T) *httptest.Server {
	t.Helper()
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"prompt too long","type":"invalid_request_error","param":null,"code":null}}`)
	}))
	t.Cleanup(e.Close)
	return e
}
