package gateway

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// routeOf is the plan route returns for a chat request to model.
func routeOf(t *testing.T, h *harness, model string) plan {
	t.Helper()
	body := []byte(`{"model":"` + model + `","messages":[{"role":"user","content":"hi"}]}`)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	f, err := openai.ParseRequest(r.URL.Path, body)
	must.NoError(t, err)
	x := &exchange{req: &scoring.Request{Model: model, Path: r.URL.Path, Body: body, Prompt: f.Prompt},
		fields: f, body: body, pol: h.doc.For(model)}
	c := &call{ctx: context.Background(), w: httptest.NewRecorder(), r: r, rec: &outcome{g: h.gw, model: model}, x: x}
	return h.gw.route(c, h.doc)
}

// Routing returns the plan a request's model, pool and policy call for,
// before anything is sent.
func TestRoutePlans(t *testing.T) {
	doc := parseDoc(t, `{"policy":"round_robin",
		"models":{"n":{"overflow":{"pool":"m","model":"m-api"}},"q":{}},
		"cascades":{"a":{"small":"m","large":"n","threshold":-1}}}`)
	h := newHarness(t, doc, nil, map[string]string{"m1": "m@" + deadAddr(t)})

	must.Eq[plan](t, planAdmit{}, routeOf(t, h, "m"))

	p, ok := routeOf(t, h, "n").(*planOverflow)
	must.True(t, ok)
	must.Eq(t, reasonNoWorker, p.reason)
	must.Eq(t, "m", p.x.req.Model)
	must.StrContains(t, string(p.x.body), `"model":"m-api"`)

	cs, ok := routeOf(t, h, "a").(*planCascade)
	must.True(t, ok)
	must.Eq(t, "m", cs.c.Small)

	ref, ok := routeOf(t, h, "q").(*refusal)
	must.True(t, ok)
	must.Eq(t, http.StatusServiceUnavailable, ref.status)
	must.Eq(t, "no_healthy_worker", ref.code)

	ref, ok = routeOf(t, h, "nope").(*refusal)
	must.True(t, ok)
	must.Eq(t, http.StatusNotFound, ref.status)
	must.Eq(t, "model_not_found", ref.code)
}

// A failed attempt's next plan is a retry on a worker not tried yet, then
// the last failure's error.
func TestRetryIsANewPlan(t *testing.T) {
	h := newHarness(t, nil, nil, map[string]string{"m1": "m@" + deadAddr(t), "m2": "m@" + deadAddr(t)})
	body := []byte(chatM)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", bytes.NewReader(body))
	c := &call{ctx: context.Background(), w: httptest.NewRecorder(), r: r, rec: &outcome{g: h.gw, model: "m"},
		x: &exchange{req: &scoring.Request{Model: "m", Path: r.URL.Path, Body: body}, body: body, pol: h.doc.For("m")}}
	var st attempts
	first, ok := h.gw.pick(c, &st).(planWorker)
	must.True(t, ok)
	second, ok := h.gw.runWorker(c, &st, first).(planWorker)
	must.True(t, ok)
	must.NotEq(t, first.wk.ID, second.wk.ID)
	ref, ok := h.gw.runWorker(c, &st, second).(*refusal)
	must.True(t, ok)
	must.Eq(t, "no_reachable_worker", ref.code)
}
