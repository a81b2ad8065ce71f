package gateway

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/admission"
)

// serve routes c to its model and carries the plan out, answering the
// client.
func (g *Gateway) serve(c *call) {
	g.countArrival(c.x.req.Model)
	g.execute(c, g.routeModel(c))
}

// execute carries out p and the plans that follow it until the client has
// its answer. An admission slot the request took is given back at the end.
func (g *Gateway) execute(c *call, p plan) {
	var st attempts
	defer c.x.releaseSlot()
	for p != nil {
		p = g.step(c, &st, p)
	}
}

// step carries out one plan and returns the next, nil once the client has
// its answer.
func (g *Gateway) step(c *call, st *attempts, p plan) plan {
	switch p := p.(type) {
	case planAdmit:
		return g.admit(c, st)
	case planWorker:
		return g.runWorker(c, st, p)
	case *planPair:
		return g.runPair(c, st, p)
	case *planRemote:
		return g.runRemote(c, p)
	case *planOverflow:
		g.runOverflow(c, p)
	case *planCascade:
		g.runCascade(c, &p.c)
	case *planColdStart:
		return g.holdForEngine(c, p)
	case *refusal:
		g.refuse(c, p)
	default:
		panic("gateway: a plan without a step")
	}
	return nil
}

// admit waits for an admission slot; with one, the next plan is choose's.
// Without, the model's overflow pool, else the refusal.
func (g *Gateway) admit(c *call, st *attempts) plan {
	x := c.x
	model := x.req.Model
	actx, sp := c.rec.tr.admission(c.ctx)
	slot, err := g.cfg.Admission.AcquireSlot(actx, model, x.pol.Limits)
	c.rec.tr.queued(sp, err)
	switch {
	case err == nil:
	case errors.Is(err, admission.ErrQueueFull):
		return g.overflowOr(c, reasonQueueFull, &refusal{status: http.StatusTooManyRequests, typ: "requests", code: "model_overloaded",
			msg: "too many requests queued for model " + strconv.Quote(model), retryAfter: time.Second,
			count: "queue_full"})
	case errors.Is(err, admission.ErrQueueTimeout):
		return g.overflowOr(c, reasonQueueTimeout, &refusal{status: http.StatusServiceUnavailable, typ: "server_error", code: "queue_timeout",
			msg: "timed out waiting for capacity for model " + strconv.Quote(model), retryAfter: time.Second,
			count: "queue_timeout"})
	default:
		return g.contextRefusal(c, "deadline expired while queued")
	}
	var once sync.Once
	x.release = func() { once.Do(slot.Release) }
	if g.cfg.Prepare != nil {
		g.cfg.Prepare(x.req)
	}
	x.req.AdapterLoad = g.adapterLoadTime(model)
	c.rec.tr.wrapTokenize(x.req)
	return g.choose(c, st)
}

// runWorker sends the request to p's worker. When that fails before
// anything reached the client the next plan is a retry on another worker
// (pick), or, after the last attempt, localFailed's.
func (g *Gateway) runWorker(c *call, st *attempts, p planWorker) plan {
	x, wk := c.x, p.wk
	c.rec.worker = wk.ID
	err := g.forward(c, wk, st.n == 0)
	var ue *upstreamError
	switch {
	case err == nil:
		return nil
	case c.ctx.Err() != nil:
		return g.contextRefusal(c, "deadline expired before the engine answered")
	case !errors.As(err, &ue):
		return internalError("internal_error", "building the upstream request failed")
	}
	st.last = ue
	st.n++
	if st.n == maxAttempts {
		return g.localFailed(c, ue, "")
	}
	g.m.Retries.WithLabelValues(x.req.Model).Inc()
	c.rec.tr.retried()
	g.log.Warn("engine failed before the first token; retrying on another worker",
		"model", x.req.Model, "worker", wk.ID, "request_id", x.reqID, "error", err)
	return g.pick(c, st)
}

// refuse answers the request with e.
func (g *Gateway) refuse(c *call, e *refusal) {
	if e.count != "" {
		g.m.AdmissionRefused.WithLabelValues(c.rec.model, e.count).Inc()
	}
	if e.status == 499 {
		c.rec.status = 499
		return
	}
	c.rec.fail(c.w, e.status, e.typ, e.code, e.param, e.msg, e.retryAfter)
}
