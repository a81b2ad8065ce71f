package gateway

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// fakeHosted is a TLS OpenAI-compatible endpoint recording the model names
// it was asked for.
type fakeHosted struct {
	srv    *httptest.Server
	models chan string
}

func newFakeHosted(t *testing.T) *fakeHosted {
	f := &fakeHosted{models: make(chan string, 16)}
	f.srv = httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var b struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&b)
		f.models <- b.Model
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","model":"`+b.Model+`","choices":[{"index":0,"message":{"role":"assistant","content":"hosted"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeHosted) seen() int { return len(f.models) }

// overflowHarness serves a gateway whose pool has the local engines
// (id → "model@host:port") and the fake hosted endpoint registered for
// hostedModel, allow-listed as -hosted-upstreams would.
func overflowHarness(t *testing.T, doc *policy.Document, f *fakeHosted, hostedModel string, local map[string]string) *harness {
	hp, err := discovery.ParseHostedPolicy([]string{f.srv.URL + "/v1"}, nil)
	must.NoError(t, err)
	h := &harness{t: t, pool: discovery.New(discovery.Config{Hosted: hp}), reg: prometheus.NewRegistry(), doc: doc}
	h.m = metrics.New(h.reg)
	ins := []discovery.Instance{{ID: "hosted-1", Address: "127.0.0.1:1", Meta: map[string]string{
		discovery.MetaModel: hostedModel, discovery.MetaEngine: "openai_compat", discovery.MetaUpstream: f.srv.URL + "/v1"}}}
	for id, spec := range local {
		model, a, _ := strings.Cut(spec, "@")
		ins = append(ins, discovery.Instance{ID: id, Address: a, Meta: map[string]string{discovery.MetaModel: model}})
	}
	h.pool.Set(ins)
	terms, err := scoring.NewRegistry(scoring.BuiltinTerms()...)
	must.NoError(t, err)
	h.gw, err = New(Config{Pool: h.pool, Policy: StaticPolicy{Doc: doc}, Selector: scoring.NewSelector(scoring.SelectorConfig{Registry: terms}),
		Admission: admission.New(), Metrics: h.m, Gatherer: h.reg, Logger: hclog.NewNullLogger(),
		Transport: engineTransport(t), HostedTransport: f.srv.Client().Transport})
	must.NoError(t, err)
	h.srv = httptest.NewServer(h.gw)
	t.Cleanup(h.srv.Close)
	return h
}

// blockingEngine answers once release is closed.
func blockingEngine(t *testing.T, release chan struct{}, started *atomic.Int32) *httptest.Server {
	e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		started.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"local"},"finish_reason":"stop"}]}`)
	}))
	t.Cleanup(e.Close)
	return e
}

func parseDoc(t *testing.T, s string) *policy.Document {
	terms, err := scoring.NewRegistry(scoring.BuiltinTerms()...)
	must.NoError(t, err)
	d, err := policy.Parse([]byte(s), terms)
	must.NoError(t, err)
	return d
}

const chatM = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`

// A request the saturated local pool would refuse goes to the hosted pool,
// under the hosted API's model name; without an overflow it is refused.
func TestOverflow(t *testing.T) {
	cases := []struct {
		name, overflow string
		queue          int
		wantStatus     int
		wantReason     string
	}{
		{"queue full", `"overflow":{"pool":"m-hosted","model":"gpt-x"}`, 0, 200, "queue_full"},
		{"ttft over", `"overflow":{"pool":"m-hosted","model":"gpt-x","when":"ttft_over","ttft_seconds":0.2}`, 8, 200, "ttft_over"},
		{"queue timeout", `"overflow":{"pool":"m-hosted","model":"gpt-x","when":"queue_full"}`, 8, 200, "queue_timeout"},
		{"no overflow", `"policy":"round_robin"`, 0, 429, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			release, started := make(chan struct{}), &atomic.Int32{}
			local := blockingEngine(t, release, started)
			first := make(chan *http.Response, 1)
			defer func() {
				close(release)
				readAllString(t, <-first)
			}()
			f := newFakeHosted(t)
			doc := parseDoc(t, `{"policy":"round_robin","models":{"m":{"admission":{"max_in_flight":1,"max_queue":`+
				itoa(tc.queue)+`,"queue_timeout":"300ms"},`+tc.overflow+`}}}`)
			h := overflowHarness(t, doc, f, "m-hosted", map[string]string{"l1": "m@" + addr(local)})

			go func() { first <- h.post("/v1/chat/completions", chatM) }()
			testutil.Eventually(t, 5*time.Second, "the first request to reach the local engine", func() bool { return started.Load() == 1 })

			resp := h.post("/v1/chat/completions", chatM)
			body := readAllString(t, resp)
			must.Eq(t, tc.wantStatus, resp.StatusCode, must.Sprint(body))
			must.Eq(t, tc.wantReason, resp.Header.Get(OverflowHeader))
			if tc.wantReason == "" {
				must.Eq(t, 0, f.seen())
				return
			}
			must.StrContains(t, body, `"content":"hosted"`)
			must.Eq(t, "gpt-x", <-f.models)
			must.Eq(t, 1.0, promtest.ToFloat64(h.m.Overflowed.WithLabelValues("m", tc.wantReason)))
			must.Eq(t, int32(1), started.Load())
		})
	}
}

// With no healthy local worker the request overflows; a model without
// overflow still answers 503.
func TestOverflowNoWorker(t *testing.T) {
	f := newFakeHosted(t)
	doc := parseDoc(t, `{"policy":"round_robin","models":{"m":{"overflow":{"pool":"m-hosted"}},"n":{}}}`)
	h := overflowHarness(t, doc, f, "m-hosted", nil)
	resp := h.post("/v1/chat/completions", chatM)
	must.Eq(t, 200, resp.StatusCode, must.Sprint(readAllString(t, resp)))
	must.Eq(t, "no_worker", resp.Header.Get(OverflowHeader))
	must.Eq(t, "m-hosted", <-f.models) // the pool's name by default
	resp = h.post("/v1/chat/completions", strings.Replace(chatM, `"m"`, `"n"`, 1))
	readAllString(t, resp)
	must.Eq(t, 503, resp.StatusCode)
}

// A hosted worker registered for the same model as local ones is not their
// peer unless the policy says so.
func TestHostedNotPeer(t *testing.T) {
	cases := []struct {
		name, doc  string
		wantHosted bool
	}{
		{"default: local only", `{"policy":"round_robin"}`, false},
		{"hosted_peers document-wide", `{"policy":"round_robin","hosted_peers":true}`, true},
		{"hosted_peers per model", `{"policy":"round_robin","models":{"m":{"hosted_peers":true}}}`, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			close(release)
			local := blockingEngine(t, release, &atomic.Int32{})
			f := newFakeHosted(t)
			h := overflowHarness(t, parseDoc(t, tc.doc), f, "m", map[string]string{"l1": "m@" + addr(local)})
			for range 4 {
				resp := h.post("/v1/chat/completions", chatM)
				readAllString(t, resp)
				must.Eq(t, 200, resp.StatusCode)
			}
			must.Eq(t, tc.wantHosted, f.seen() > 0)
		})
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
