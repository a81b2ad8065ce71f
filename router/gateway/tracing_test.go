package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

const (
	clientTraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	clientSpanID  = "00f067aa0ba902b7"
	clientParent  = "00-" + clientTraceID + "-" + clientSpanID + "-01"
)

// traceEngine answers a JSON completion with usage and sends every
// traceparent it receives on seen.
func traceEngine(t *testing.T, seen chan<- string) *httptest.Server {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		seen <- r.Header.Get("Traceparent")
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"id":"x","usage":{"prompt_tokens":3,"completion_tokens":5,"total_tokens":8}}`)
	}))
	t.Cleanup(s.Close)
	return s
}

func TestTracingSpanTree(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	seen := make(chan string, 4)
	e := traceEngine(t, seen)
	doc := &policy.Document{Policy: scoring.Weighted, Weights: map[string]float64{"load": 1}}
	h := newHarnessWith(t, Config{TracerProvider: tp}, doc, map[string]string{"w1": "m@" + addr(e)})

	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		"Traceparent", clientParent)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	must.EqOp(t, http.StatusOK, resp.StatusCode)
	must.NoError(t, tp.ForceFlush(context.Background()))

	spans := sr.Ended()
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		must.EqOp(t, clientTraceID, s.SpanContext().TraceID().String())
		byName[s.Name()] = s
	}
	root, ok := byName["POST /v1/chat/completions"]
	must.True(t, ok, must.Sprintf("spans: %v", names(spans)))
	must.EqOp(t, clientSpanID, root.Parent().SpanID().String())
	must.EqOp(t, trace.SpanKindServer, root.SpanKind())
	for _, n := range []string{SpanAdmission, SpanRoute, SpanUpstream} {
		s, ok := byName[n]
		must.True(t, ok, must.Sprintf("no %s span in %v", n, names(spans)))
		must.EqOp(t, root.SpanContext().SpanID(), s.Parent().SpanID())
	}
	attrs := attrMap(root.Attributes())
	must.EqOp(t, "m", attrs[AttrModel].AsString())
	must.EqOp(t, "w1", attrs[AttrWorker].AsString())
	must.EqOp(t, scoring.Weighted, attrs[AttrPolicy].AsString())
	must.EqOp(t, 1.0, attrs[AttrTermPrefix+"load"].AsFloat64())
	must.EqOp(t, int64(3), attrs[AttrPromptTokens].AsInt64())
	must.EqOp(t, int64(5), attrs[AttrOutputTokens].AsInt64())
	must.EqOp(t, int64(0), attrs[AttrRetries].AsInt64())
	must.EqOp(t, int64(200), attrs[AttrStatus].AsInt64())
	_, ok = attrs[AttrTTFT]
	must.True(t, ok)
	_, ok = attrs[AttrQueueWait]
	must.True(t, ok)

	up := byName[SpanUpstream]
	must.EqOp(t, "00-"+clientTraceID+"-"+up.SpanContext().SpanID().String()+"-01", <-seen)
}

func TestTracingRetrySpans(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	seen := make(chan string, 4)
	e := traceEngine(t, seen)
	h := newHarnessWith(t, Config{TracerProvider: tp}, nil,
		map[string]string{"dead": "m@" + deadAddr(t), "live": "m@" + addr(e)})
	// Round robin from the first worker: the dead one, then a retry.
	for range 2 {
		resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		must.EqOp(t, http.StatusOK, resp.StatusCode)
	}
	// Every root's retries are its failed upstream attempts.
	attempts := map[trace.SpanID]int{}
	for _, s := range sr.Ended() {
		if s.Name() == SpanUpstream {
			attempts[s.Parent().SpanID()]++
		}
	}
	retried := 0
	for _, s := range sr.Ended() {
		if strings.HasPrefix(s.Name(), "POST ") {
			n := attrMap(s.Attributes())[AttrRetries].AsInt64()
			must.EqOp(t, int(n)+1, attempts[s.SpanContext().SpanID()])
			retried += int(n)
		}
	}
	must.Positive(t, retried)
}

func TestTracingOffKeepsClientTraceparent(t *testing.T) {
	seen := make(chan string, 1)
	e := traceEngine(t, seen)
	h := newHarness(t, nil, nil, map[string]string{"w1": "m@" + addr(e)})
	resp := h.post("/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		"Traceparent", clientParent)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	must.EqOp(t, clientParent, <-seen)
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	out := make([]string, len(spans))
	for i, s := range spans {
		out[i] = s.Name()
	}
	return out
}

func attrMap(kvs []attribute.KeyValue) map[attribute.Key]attribute.Value {
	m := make(map[attribute.Key]attribute.Value, len(kvs))
	for _, kv := range kvs {
		m[kv.Key] = kv.Value
	}
	return m
}

func TestTracingPDLegs(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	p := newPDEngine(t, vllmPrefill)
	d := newPDEngine(t, streamDecode)
	h := newHarnessWith(t, Config{MaxBodyBytes: 1 << 20, TracerProvider: tp}, pdDoc(), map[string]string{})
	h.pool.Set([]discovery.Instance{pdInstance("p1", addr(p.srv), "prefill", "vllm"),
		pdInstance("d1", addr(d.srv), "decode", "vllm")})
	resp := h.post("/v1/completions", pdStreamBody, "Traceparent", clientParent)
	must.EqOp(t, http.StatusOK, resp.StatusCode)
	_ = readAllString(t, resp)

	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		byName[s.Name()] = s
	}
	root := byName["POST /v1/completions"]
	must.NotNil(t, root, must.Sprintf("spans: %v", names(sr.Ended())))
	for _, n := range []string{SpanAdmission, SpanRoute, SpanPrefill, SpanDecode} {
		s, ok := byName[n]
		must.True(t, ok, must.Sprintf("no %s span in %v", n, names(sr.Ended())))
		must.EqOp(t, root.SpanContext().SpanID(), s.Parent().SpanID())
	}
	route := attrMap(byName[SpanRoute].Attributes())
	must.EqOp(t, "pd_pair", route[AttrPolicy].AsString())
	must.EqOp(t, "p1", route[AttrPrefill].AsString())
	must.EqOp(t, "d1", route[AttrDecode].AsString())
	must.EqOp(t, "p1", attrMap(byName[SpanPrefill].Attributes())[AttrWorker].AsString())
	must.EqOp(t, "d1", attrMap(byName[SpanDecode].Attributes())[AttrWorker].AsString())
	must.EqOp(t, "d1", attrMap(root.Attributes())[AttrWorker].AsString())
}
