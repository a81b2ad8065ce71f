package gateway

// A request's path through the gateway is plan, then execute:
//
//   - proxy (proxy.go) takes the request in over HTTP: loop refusal, body,
//     fields, deadline, trace, and builds the call (one value per request).
//   - route (route.go) looks at the request, its model's pool and policy
//     and the federation's view, and returns a plan (below); routeModel is
//     that step for a request to a model (an overflow pool's, a cascade
//     leg's).
//   - execute (execute.go) carries the plan out. A plan that did not answer
//     the client returns the next one (a retry on another worker, a
//     fallback to the local pool, an error to answer); nil means the client
//     has its answer. Retries and fallbacks are plans, not special cases.
//
// A new kind of plan is a type here, the routing step that chooses it
// (route.go, or the step of execute.go it follows), and a case in
// gateway.step.

import (
	"context"
	"net/http"
	"time"

	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// call is one client request on its way through the gateway: what it asks
// (x), its deadline and trace (ctx, and rec.tr), who asked (r) and where
// the answer goes (w), recorded once in rec.
type call struct {
	ctx context.Context
	w   http.ResponseWriter
	r   *http.Request
	rec *outcome
	x   *exchange
	pin string // the only engine instance the request may go to (responses.go); "" any
}

// with returns a copy of c that asks x instead (an overflow pool's or a
// cascade leg's request).
func (c *call) with(x *exchange) *call {
	d := *c
	d.x = x
	return &d
}

// plan is what routing decided for a request: one of planAdmit,
// planWorker, *planPair, *planRemote, *planOverflow, *planCascade,
// *planColdStart (coldstart.go) and *refusal.
type plan interface{ isPlan() }

// planAdmit waits for a local admission slot, then chooses a worker or a
// prefill/decode pair (route.go, choose).
type planAdmit struct{}

// planWorker serves the request on one local worker; its choice is what
// the trace's route span and scoring.Selector.Explain describe.
type planWorker struct{ wk *scoring.Worker }

// planPair serves the request through a prefill/decode pair (disagg.go).
type planPair struct {
	pair            scoring.Pair
	prefill, decode []*scoring.Worker // the model's sides
	direct          bool              // a worker may serve it by itself (the fallback)
	retry           int               // 0: the first pair, 1: after a decode leg failed
	failedP, triedD []*scoring.Worker
}

// planRemote sends the request to a router in another datacenter; when that
// fails before the first byte, then is the next plan.
type planRemote struct {
	d    federation.Decision
	keys []uint64 // prefix keys to remember as local when the request stays
	then plan
}

// planOverflow sends the request, as x, to its model's overflow pool.
type planOverflow struct {
	x      *exchange
	reason string
}

// planCascade serves a cascade alias: its small model, then maybe its
// large one (cascade.go).
type planCascade struct{ c policy.Cascade }

// refusal answers the request with an error in OpenAI's shape; status 499
// answers nothing (the client left). count, when set, is the
// oasis_router_admission_refused_total reason it counts as.
type refusal struct {
	status           int
	typ, code, param string
	msg              string
	retryAfter       time.Duration
	count            string
}

func (e *refusal) Error() string { return e.msg }

func (planAdmit) isPlan()     {}
func (planWorker) isPlan()    {}
func (*planPair) isPlan()     {}
func (*planRemote) isPlan()   {}
func (*planOverflow) isPlan() {}
func (*planCascade) isPlan()  {}
func (*refusal) isPlan()      {}

// internalError is the refusal for a request the router itself failed.
func internalError(code, msg string) *refusal {
	return &refusal{status: http.StatusInternalServerError, typ: "server_error", code: code, msg: msg}
}
