package gateway

// Cascade aliases (router/cascade has the legs' bodies, the gate and the
// small answer's shapes): the small leg runs buffered as a request of its
// own, the large one as any request, relayed.

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/oasis-llm/oasis/router/cascade"
	"github.com/oasis-llm/oasis/router/policy"
)

// Cascade response headers (cascade.Header and the small leg's figures).
const (
	CascadeHeader               = cascade.Header
	SmallPromptTokensHeader     = cascade.SmallPromptTokensHeader
	SmallCompletionTokensHeader = cascade.SmallCompletionTokensHeader
	SmallLogprobHeader          = cascade.SmallLogprobHeader
)

// runCascade serves a request for a cascade alias: the small model first,
// without streaming and with log probabilities; its answer goes to the
// client when its mean token log probability clears the threshold, else the
// request goes to the large model, whose answer is relayed as usual.
func (g *Gateway) runCascade(c *call, cs *policy.Cascade) {
	x, w, rec := c.x, c.w, c.rec
	alias := x.req.Model
	orig, err := cascade.DecodeObject(x.body)
	if err != nil {
		rec.fail(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "", err.Error(), 0)
		return
	}
	t0 := time.Now()
	ans, ok := g.smallLeg(c, cs, orig)
	g.m.CascadeLeg.WithLabelValues(alias, "small").Observe(time.Since(t0).Seconds())
	if c.r.Context().Err() != nil {
		rec.status = 499 // the client left while the small model answered
		return
	}
	if c.ctx.Err() != nil {
		g.refuse(c, g.contextRefusal(c, "deadline expired while the small model answered"))
		return
	}
	outcome := cascade.SmallFailed
	if ok {
		ans.SetHeaders(w.Header())
		outcome = cascade.Escalated
		if ans.Accept(cs) {
			outcome = cascade.Small
		}
		u := ans.Usage()
		g.m.CascadeSmallTokens.WithLabelValues(alias, outcome, "prompt").Add(float64(u.PromptTokens))
		g.m.CascadeSmallTokens.WithLabelValues(alias, outcome, "completion").Add(float64(u.CompletionTokens))
	}
	g.m.CascadeRequests.WithLabelValues(alias, outcome).Inc()
	if outcome == cascade.Small {
		rec.recorded = true // the small leg's own record is the request's
		w.Header().Set(CascadeHeader, cascade.Small)
		writeSmall(w, x, ans)
		return
	}
	g.escalate(c, cs, orig)
}

// escalate sends the client's request to the cascade's large model.
func (g *Gateway) escalate(c *call, cs *policy.Cascade, orig map[string]json.RawMessage) {
	body, err := cascade.LargeBody(orig, cs)
	var lx *exchange
	if err == nil {
		lx, err = g.derive(c.r, c.x, cs.Large, body)
	}
	if err != nil {
		g.refuse(c, internalError("internal_error", "building the large model's request failed"))
		return
	}
	c.w.Header().Set(CascadeHeader, cascade.Escalated)
	c.rec.model = cs.Large
	t0 := time.Now()
	g.serve(c.with(lx))
	g.m.CascadeLeg.WithLabelValues(c.x.req.Model, "large").Observe(time.Since(t0).Seconds())
}

// smallLeg runs the request on the small model, buffered. ok is false when
// the leg failed (no 200 answer, or one that is not a completion).
func (g *Gateway) smallLeg(c *call, cs *policy.Cascade, orig map[string]json.RawMessage) (*cascade.Answer, bool) {
	body, ans, err := cascade.SmallRequest(orig, c.x.fields, cs)
	if err != nil {
		return nil, false
	}
	sx, err := g.derive(c.r, c.x, cs.Small, body)
	if err != nil {
		return nil, false
	}
	bw := cascade.NewBuffer()
	g.runBuffered(c, sx, bw)
	if bw.Status != http.StatusOK || bw.Over {
		return nil, false
	}
	return ans, ans.Read(bw.Bytes()) == nil
}

// runBuffered serves sx into bw under its own outcome (the small leg counts
// as a request for the small model). A leg whose engine failed mid-answer
// aborts (http.ErrAbortHandler); that is a failed leg, not a failed client.
func (g *Gateway) runBuffered(c *call, sx *exchange, bw *cascade.Buffer) {
	srec := &outcome{g: g, start: time.Now(), model: sx.req.Model, status: http.StatusOK}
	defer srec.done()
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler { //nolint:errorlint // the sentinel is panicked, not wrapped
				panic(v)
			}
			bw.Status, srec.status = http.StatusBadGateway, http.StatusBadGateway
		}
	}()
	g.serve(&call{ctx: c.ctx, w: bw, r: c.r, rec: srec, x: sx})
}

// writeSmall sends the accepted small answer to the client as the client
// asked for it (cascade.Answer's JSON or Events).
func writeSmall(w http.ResponseWriter, x *exchange, a *cascade.Answer) {
	h := w.Header()
	h.Set("X-Request-Id", x.reqID)
	if x.fields.Stream {
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(a.Events(x.fields.IncludeUsage))
		if fl, ok := w.(http.Flusher); ok {
			fl.Flush()
		}
		return
	}
	body := a.JSON()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}
