package gateway

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/oasis-llm/oasis/router/pd"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// route is a client request's first routing step: a cascade alias's plan
// (for a generation endpoint), else routeModel's.
func (g *Gateway) route(c *call, doc *policy.Document) plan {
	g.countArrival(c.x.req.Model)
	if cs, ok := doc.CascadeFor(c.x.req.Model); ok && generates(c.x.req.Path) {
		return &planCascade{c: cs}
	}
	return g.routeModel(c)
}

// routeModel is the plan for a request to a model (the client's, or a
// cascade leg's, or an overflow pool's) from the model's pool and policy
// and the federation's view, before any local slot is taken. Later steps
// (choose, pick, and the failures execute reports) return the plans that
// follow.
func (g *Gateway) routeModel(c *call) plan {
	none := len(g.candidates(c.x.req.Model)) == 0
	if c.localOnly() {
		if none && c.pin == "" {
			return g.coldStartOr(c, planAdmit{})
		}
		return planAdmit{}
	}
	if none {
		// No local worker: another datacenter, else the overflow pool,
		// else a hold while the model scales from zero, else no worker.
		then := g.overflowOr(c, reasonNoWorker, g.coldStartOr(c, g.noWorker(c.x.req.Model)))
		if d, ok := g.federateEarly(c, false); ok {
			return &planRemote{d: d, then: then}
		}
		return then
	}
	if d, ok := g.federateEarly(c, true); ok {
		return &planRemote{d: d, then: g.routeLocal(c)}
	}
	return g.routeLocal(c)
}

// routeLocal is the plan for a request the local pool may serve: its
// overflow pool when the estimated time to first token is over the
// policy's bound, else admission.
func (g *Gateway) routeLocal(c *call) plan {
	if g.overflowEarly(c) {
		if p := g.overflowOr(c, reasonTTFT, nil); p != nil {
			return p
		}
	}
	return planAdmit{}
}

// attempts is what the direct attempts at one request have learnt.
type attempts struct {
	n     int               // attempts made
	tried []*scoring.Worker // workers chosen
	last  *upstreamError    // the last attempt's failure
}

// maxAttempts bounds a request's direct attempts: one retry.
const maxAttempts = 2

// choose is the plan once the request holds an admission slot: a
// prefill/decode pair when its model has them and the policy wants one,
// else a worker.
func (g *Gateway) choose(c *call, st *attempts) plan {
	if p := g.routePair(c); p != nil {
		return p
	}
	return g.pick(c, st)
}

// pick chooses a worker not tried yet for the request's next attempt, or,
// when none is left, the plan for a request every local attempt failed.
func (g *Gateway) pick(c *call, st *attempts) plan {
	if c.pin != "" {
		return g.pickPinned(c, st)
	}
	x := c.x
	cands := pd.Without(g.candidates(x.req.Model), st.tried)
	if len(cands) == 0 {
		if st.last == nil {
			return g.noWorker(x.req.Model)
		}
		return g.localFailed(c, st.last, "; no other worker is available")
	}
	t0 := time.Now()
	dctx, dsp := c.rec.tr.start(c.ctx, SpanRoute)
	d, err := g.cfg.Selector.Pick(dctx, x.pol.Scoring, x.req, cands)
	g.m.RoutingDecision.Observe(time.Since(t0).Seconds())
	var p planWorker
	if err == nil {
		p = planWorker{wk: d.Worker}
		c.rec.tr.decided(dctx, dsp, g.cfg.Selector, x, cands, p)
	}
	endSpan(dsp, err)
	if err != nil {
		g.log.Error("choosing worker failed", "model", x.req.Model, "error", err)
		return internalError("routing_failed", "choosing a worker failed")
	}
	st.tried = append(st.tried, p.wk)
	g.notePick(c, p.wk)
	if st.n == 0 && !c.localOnly() {
		if r := g.federateChosen(c, p); r != nil {
			return r
		}
	}
	return p
}

// localFailed is the plan for a request whose local attempts all failed
// before its first byte: another datacenter, else last's error.
func (g *Gateway) localFailed(c *call, last *upstreamError, why string) plan {
	ref := upstreamRefusal(last, why)
	if c.localOnly() {
		return ref
	}
	if d, ok := g.federateFailed(c); ok {
		return &planRemote{d: d, then: ref}
	}
	return ref
}

// upstreamRefusal answers a request whose last attempt failed before its
// first byte: 504 when the engine was silent too long, 503 when no
// connection to it could be made, 508 when it was a router the request had
// passed (hop.go), else 502.
func upstreamRefusal(e *upstreamError, why string) *refusal {
	switch {
	case e.loop:
		return &refusal{status: http.StatusLoopDetected, typ: "server_error", code: "loop_detected",
			msg: "routing loop: the engine chosen is a router this request had already passed through " +
				"(an engine registration points at a router): " + e.Error() + why}
	case e.unreachable:
		return &refusal{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_reachable_worker",
			msg: "no engine could be reached: " + e.Error() + why, retryAfter: time.Second}
	case e.timeout:
		return &refusal{status: http.StatusGatewayTimeout, typ: "server_error", code: "upstream_timeout",
			msg: "the engine did not answer in time: " + e.Error() + why}
	}
	return &refusal{status: http.StatusBadGateway, typ: "server_error", code: "upstream_unavailable",
		msg: "the engine failed before responding: " + e.Error() + why}
}

// noWorker is the refusal for a model without a worker to serve it.
func (g *Gateway) noWorker(model string) *refusal {
	_, inPolicy := g.cfg.Policy.Current().Models[model]
	switch {
	case !g.cfg.Pool.Synced():
		// Discovery has not answered yet (Consul unreachable at start-up):
		// the model may well exist.
		return &refusal{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_healthy_worker",
			msg: "engine discovery has not completed yet; no engine is known", retryAfter: time.Second}
	case g.cfg.Pool.Known(model) || inPolicy:
		return &refusal{status: http.StatusServiceUnavailable, typ: "server_error", code: "no_healthy_worker",
			msg: "no healthy engine is serving model " + strconv.Quote(model), retryAfter: time.Second}
	}
	return &refusal{status: http.StatusNotFound, typ: "invalid_request_error", code: "model_not_found", param: "model",
		msg: "The model " + strconv.Quote(model) + " does not exist or no engine serves it"}
}

// contextRefusal is the plan for a request whose context ended: nothing to
// answer when the client left, else its deadline passed (msg says where).
func (g *Gateway) contextRefusal(c *call, msg string) *refusal {
	if c.r.Context().Err() != nil {
		return &refusal{status: 499} // client went away; nothing to send
	}
	return &refusal{status: http.StatusGatewayTimeout, typ: "server_error", code: "deadline_exceeded", msg: msg,
		count: "deadline"}
}

// candidates are the workers a request may go to directly (pd.Direct):
// prefill instances, and SGLang decode instances, which wait for a prefill
// peer, are left out when others exist; so are hosted workers (oasis_upstream)
// unless the policy makes them peers (hosted_peers): they are the overflow.
func (g *Gateway) candidates(model string) []*scoring.Worker {
	ws := routable(g.cfg.Pool.Workers(model), time.Now())
	for _, w := range ws {
		if w.Upstream != "" {
			return directOnly(g.localFirst(model, ws))
		}
	}
	return directOnly(ws)
}

func directOnly(ws []*scoring.Worker) []*scoring.Worker {
	for _, w := range ws {
		if !pd.Direct(w) {
			if d := slices.DeleteFunc(slices.Clone(ws), func(w *scoring.Worker) bool { return !pd.Direct(w) }); len(d) > 0 {
				return d
			}
			return ws
		}
	}
	return ws
}

// notePick tells Config.OnPick about a worker chosen.
func (g *Gateway) notePick(c *call, wk *scoring.Worker) {
	if g.cfg.OnPick != nil {
		g.cfg.OnPick(c.ctx, c.x.pol.Scoring, c.x.req, wk)
	}
}
