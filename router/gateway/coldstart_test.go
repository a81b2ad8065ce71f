package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Scale to zero (coldstart.go): a request for a model whose policy has
// scale_to_zero and which has no engine is held until one joins the pool,
// up to the hold, the client's deadline, or the client leaving; at most
// max_held at once. Real HTTP on both sides: the harness's router and
// httptest engines.

func coldDoc(t *testing.T, hold string, maxHeld int) *policy.Document {
	t.Helper()
	return parseDoc(t, fmt.Sprintf(`{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":%q,"max_held":%d}}}}`, hold, maxHeld))
}

func coldChat(model string, stream bool) string {
	return fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"stream":%v}`, model, stream)
}

// reply is an answer read whole, or the error that ended it.
type reply struct {
	status     int
	retryAfter string
	body       string
	err        error
}

// send posts body to the chat endpoint under ctx and delivers the answer.
func (h *harness) send(ctx context.Context, body string, hdr ...string) <-chan reply {
	out := make(chan reply, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			out <- reply{err: err}
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			out <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		out <- reply{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), body: string(b), err: err}
	}()
	return out
}

func (h *harness) held(model string) float64 {
	return promtest.ToFloat64(h.m.Held.WithLabelValues(model))
}

func (h *harness) holds(model, outcome string) float64 {
	return promtest.ToFloat64(h.m.Holds.WithLabelValues(model, outcome))
}

// waitHeld waits until n requests for model are held.
func (h *harness) waitHeld(t *testing.T, model string, n float64) {
	t.Helper()
	testutil.Eventually(t, 5*time.Second, fmt.Sprintf("%v requests held for %s", n, model), func() bool { return h.held(model) == n })
}

func TestColdStartHoldsUntilAnEngineJoins(t *testing.T) {
	for _, stream := range []bool{false, true} {
		t.Run(fmt.Sprintf("stream=%v", stream), func(t *testing.T) {
			var hits atomic.Int64
			engine := echoEngine(t, "e1", &hits)
			if stream {
				engine = goodEngine(t, &hits)
			}
			h := newHarness(t, coldDoc(t, "30s", 4), nil, map[string]string{}) // discovery answered: no engine
			got := h.send(t.Context(), coldChat("m", stream))
			h.waitHeld(t, "m", 1)

			// Another model's engine changes the pool: the request looks, and waits on.
			h.setEngines(map[string]string{"x1": "x@" + addr(engine)})
			must.Eq(t, 1.0, h.held("m"))
			must.Zero(t, hits.Load())

			h.setEngines(map[string]string{"x1": "x@" + addr(engine), "e1": "m@" + addr(engine)})
			r := <-got
			must.NoError(t, r.err)
			must.Eq(t, http.StatusOK, r.status, must.Sprint(r.body))
			if stream {
				must.StrContains(t, r.body, "llo")
				must.StrContains(t, r.body, "data: [DONE]")
			} else {
				must.StrContains(t, r.body, `"engine":"e1"`)
			}
			must.Eq(t, 1, hits.Load())
			must.Eq(t, 0.0, h.held("m"))
			must.Eq(t, 1.0, h.holds("m", metrics.HoldServed))
			must.Eq(t, 1, promtest.CollectAndCount(h.m.HoldWait))
		})
	}
}

func TestColdStartRefusals(t *testing.T) {
	cases := []struct {
		name, hold, deadline string
		status               int
		code, retryAfter     string
		outcome              string
		atLeast              time.Duration
	}{
		{name: "hold passes", hold: "1s", status: http.StatusServiceUnavailable, code: "cold_start_timeout",
			retryAfter: "1", outcome: metrics.HoldTimeout, atLeast: time.Second},
		{name: "client deadline first", hold: "30s", deadline: "200", status: http.StatusGatewayTimeout,
			code: "deadline_exceeded", outcome: metrics.HoldCancelled, atLeast: 200 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, coldDoc(t, tc.hold, 4), nil, map[string]string{})
			var hdr []string
			if tc.deadline != "" {
				hdr = []string{DeadlineHeader, tc.deadline}
			}
			t0 := time.Now()
			r := <-h.send(t.Context(), coldChat("m", true), hdr...)
			must.NoError(t, r.err)
			must.Eq(t, tc.status, r.status, must.Sprint(r.body))
			must.StrContains(t, r.body, `"code":"`+tc.code+`"`)
			must.StrContains(t, r.body, `"type":"server_error"`)
			must.Eq(t, tc.retryAfter, r.retryAfter)
			must.Greater(t, tc.atLeast-time.Millisecond, time.Since(t0))
			must.Eq(t, 1.0, h.holds("m", tc.outcome))
			must.Eq(t, 0.0, h.held("m"))
		})
	}
}

func TestColdStartBoundsHeldRequests(t *testing.T) {
	var hits atomic.Int64
	engine := goodEngine(t, &hits)
	h := newHarness(t, coldDoc(t, "30s", 1), nil, map[string]string{})
	first := h.send(t.Context(), coldChat("m", true))
	h.waitHeld(t, "m", 1)

	t0 := time.Now()
	r := <-h.send(t.Context(), coldChat("m", false))
	must.NoError(t, r.err)
	must.Eq(t, http.StatusServiceUnavailable, r.status)
	must.StrContains(t, r.body, `"code":"cold_start_full"`)
	must.Eq(t, "30", r.retryAfter) // the longest a held request keeps its place
	must.Less(t, 5*time.Second, time.Since(t0), must.Sprint("a refusal past max_held is immediate"))
	must.Eq(t, 1.0, h.holds("m", metrics.HoldFull))

	h.setEngines(map[string]string{"e1": "m@" + addr(engine)})
	r = <-first
	must.NoError(t, r.err)
	must.Eq(t, http.StatusOK, r.status)
	must.Eq(t, 1, hits.Load())
}

func TestColdStartClientLeavingFreesItsPlace(t *testing.T) {
	var hits atomic.Int64
	engine := echoEngine(t, "e1", &hits)
	h := newHarness(t, coldDoc(t, "30s", 1), nil, map[string]string{})
	ctx, cancel := context.WithCancel(t.Context())
	gone := h.send(ctx, coldChat("m", true))
	h.waitHeld(t, "m", 1)
	cancel()
	must.Error(t, (<-gone).err)
	testutil.Eventually(t, 5*time.Second, "the cancelled hold counted and its place free", func() bool {
		return h.holds("m", metrics.HoldCancelled) == 1 && h.held("m") == 0
	})

	// The place is free: the next request is held, not refused.
	next := h.send(t.Context(), coldChat("m", false))
	h.waitHeld(t, "m", 1)
	h.setEngines(map[string]string{"e1": "m@" + addr(engine)})
	r := <-next
	must.NoError(t, r.err)
	must.Eq(t, http.StatusOK, r.status)
	must.Eq(t, 1, hits.Load(), must.Sprint("the request whose client left never reached an engine"))
	must.Zero(t, h.holds("m", metrics.HoldFull))
}

// Without scale_to_zero nothing changes: a model the router never saw and
// the policy does not name is 404, one the policy names 503 at once.
func TestColdStartOnlyForModelsThatScaleToZero(t *testing.T) {
	doc := parseDoc(t, `{"policy":"round_robin","models":{"known":{"policy":"least_load"},"m":{"scale_to_zero":{}}}}`)
	h := newHarness(t, doc, nil, map[string]string{})
	cases := []struct {
		model  string
		status int
		code   string
	}{
		{"nope", http.StatusNotFound, "model_not_found"},
		{"known", http.StatusServiceUnavailable, "no_healthy_worker"},
	}
	for _, tc := range cases {
		t.Run(tc.model, func(t *testing.T) {
			r := <-h.send(t.Context(), coldChat(tc.model, false))
			must.NoError(t, r.err)
			must.Eq(t, tc.status, r.status)
			must.StrContains(t, r.body, `"code":"`+tc.code+`"`)
		})
	}
	must.Zero(t, promtest.CollectAndCount(h.m.Held), must.Sprint("no request was held"))
}

// A model with an overflow pool overflows before it is held: the pool
// serves now, a cold start takes a while (router/README "Scale to zero").
func TestColdStartAfterOverflow(t *testing.T) {
	var hits atomic.Int64
	hosted := echoEngine(t, "o1", &hits)
	doc := parseDoc(t, `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":"30s"},"overflow":{"pool":"m-hosted"}}}}`)
	h := newHarness(t, doc, nil, map[string]string{"o1": "m-hosted@" + addr(hosted)})
	resp := h.post("/v1/chat/completions", coldChat("m", false))
	body := readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
	must.Eq(t, reasonNoWorker, resp.Header.Get(OverflowHeader))
	must.Eq(t, 1, hits.Load())
	must.Zero(t, promtest.CollectAndCount(h.m.Held), must.Sprint("no request was held"))
}

// Another datacenter serving the model comes before the hold too.
func TestColdStartAfterOtherDatacenter(t *testing.T) {
	var remote atomic.Int64
	e2 := goodEngine(t, &remote)
	on := true
	doc := &policy.Document{Policy: scoring.RoundRobin, Federation: &policy.Federation{Enabled: &on},
		Models: map[string]policy.Model{"m": {ScaleToZero: &policy.ScaleToZero{}}}}
	dc1, _ := fedPairOver(t, false, doc, map[string]string{"x": "other@" + deadAddr(t)}, map[string]string{"b": "m@" + addr(e2)})
	resp := dc1.h.post("/v1/chat/completions", streamBody)
	body := readAllString(t, resp)
	must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
	must.StrContains(t, body, "data: [DONE]")
	must.Eq(t, 1, remote.Load())
	must.Eq(t, 1, forwardedCount(t, dc1))
	must.Zero(t, promtest.CollectAndCount(dc1.h.m.Held), must.Sprint("no request was held"))
}

// The hold is the request's oasis.cold_start span, with its outcome.
func TestColdStartSpan(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	var hits atomic.Int64
	engine := echoEngine(t, "e1", &hits)
	h := newHarnessWith(t, Config{TracerProvider: tp}, coldDoc(t, "30s", 4), map[string]string{})
	got := h.send(t.Context(), coldChat("m", false), "Traceparent", clientParent)
	h.waitHeld(t, "m", 1)
	h.setEngines(map[string]string{"e1": "m@" + addr(engine)})
	r := <-got
	must.NoError(t, r.err)
	must.Eq(t, http.StatusOK, r.status)
	must.NoError(t, tp.ForceFlush(context.Background()))
	byName := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range sr.Ended() {
		byName[s.Name()] = s
	}
	root, ok := byName["POST /v1/chat/completions"]
	must.True(t, ok, must.Sprintf("spans: %v", names(sr.Ended())))
	hold, ok := byName[SpanColdStart]
	must.True(t, ok, must.Sprintf("no %s span in %v", SpanColdStart, names(sr.Ended())))
	must.Eq(t, root.SpanContext().SpanID(), hold.Parent().SpanID())
	must.Eq(t, metrics.HoldServed, attrMap(hold.Attributes())[AttrColdStartOutcome].AsString())
	_, ok = byName[SpanUpstream]
	must.True(t, ok, must.Sprint("the held request went on to its engine"))
}
