package gateway

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Scale to zero: a model whose policy has scale_to_zero may run with no
// engine. A request for it that finds no routable worker, no other
// datacenter and no overflow pool to serve it is held (planColdStart)
// instead of refused: the held-requests gauge
// (oasis_router_scaling_held_requests) is what the autoscaler starts the
// model's first engine on, and every change of the pool wakes the held
// requests to look again. The first one that finds a worker is routed as
// any other request; past the model's hold (or the client's deadline, or
// when the client leaves) it is answered instead. Nothing is written to
// the client while it is held, so a refusal is still a clean error.

// planColdStart holds a request until its model has a routable worker.
type planColdStart struct{ p policy.ColdStartPolicy }

func (*planColdStart) isPlan() {}

// AttrColdStartOutcome is how a hold (the oasis.cold_start span) ended:
// served, timeout, cancelled.
const AttrColdStartOutcome = attribute.Key("oasis.cold_start.outcome")

// coldStartRetryAfter is the Retry-After of a hold that timed out: the
// engine may be moments away, and a retry is held again.
const coldStartRetryAfter = time.Second

// coldStarts is the gateway's held requests: how many per model, and a
// channel closed at every change of the pool (then replaced), which is
// what they wait on.
type coldStarts struct {
	mu      sync.Mutex
	changed chan struct{}
	held    map[string]int
}

func newColdStarts() *coldStarts {
	return &coldStarts{changed: make(chan struct{}), held: map[string]int{}}
}

// poolChanged wakes every held request (discovery.Pool.OnChange).
func (cs *coldStarts) poolChanged([]*scoring.Worker) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	close(cs.changed)
	cs.changed = make(chan struct{})
}

// next is closed at the pool's next change.
func (cs *coldStarts) next() <-chan struct{} {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	return cs.changed
}

// enter takes one of model's max places; false when all are taken.
func (cs *coldStarts) enter(model string, max int) bool {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.held[model] >= max {
		return false
	}
	cs.held[model]++
	return true
}

// leave gives a place back.
func (cs *coldStarts) leave(model string) {
	cs.mu.Lock()
	defer cs.mu.Unlock()
	if cs.held[model]--; cs.held[model] <= 0 {
		delete(cs.held, model)
	}
}

// coldStartOr is the hold for a request whose model has no routable worker
// when its policy scales it to zero, else otherwise.
func (g *Gateway) coldStartOr(c *call, otherwise plan) plan {
	p, ok := g.cfg.Policy.Current().ColdStartFor(c.x.req.Model)
	if !ok {
		return otherwise
	}
	return &planColdStart{p: p}
}

// holdForEngine holds c until its model has a routable worker, then routes
// it locally (routeLocal: overflow on the TTFT bound, else admission);
// past the hold a 503 with Retry-After, with max_held requests already
// held a 503 at once. The hold is the request's oasis.cold_start span.
func (g *Gateway) holdForEngine(c *call, p *planColdStart) plan {
	model := c.x.req.Model
	// The request counters exist before the first held request ends, so a
	// scale-in query over them (request_duration_seconds_count) sees it.
	g.m.Model(model)
	g.m.ColdStartModel(model)
	if !g.cold.enter(model, p.p.MaxHeld) {
		g.m.Holds.WithLabelValues(model, metrics.HoldFull).Inc()
		return &refusal{status: http.StatusServiceUnavailable, typ: "server_error", code: "cold_start_full",
			msg: "no engine is serving model " + strconv.Quote(model) + " yet and " + strconv.Itoa(p.p.MaxHeld) +
				" requests already wait for one to start (scale_to_zero.max_held)", retryAfter: p.p.Hold}
	}
	held := g.m.Held.WithLabelValues(model)
	held.Inc()
	defer func() {
		held.Dec()
		g.cold.leave(model)
	}()
	_, sp := c.rec.tr.start(c.ctx, SpanColdStart)
	t0 := time.Now()
	outcome := g.waitForEngine(c.ctx, model, p.p.Hold)
	g.m.Holds.WithLabelValues(model, outcome).Inc()
	sp.SetAttributes(AttrColdStartOutcome.String(outcome))
	var next plan
	var err error
	switch outcome {
	case metrics.HoldServed:
		g.m.HoldWait.WithLabelValues(model).Observe(time.Since(t0).Seconds())
		next = g.routeLocal(c)
	case metrics.HoldTimeout:
		r := &refusal{status: http.StatusServiceUnavailable, typ: "server_error", code: "cold_start_timeout",
			msg: "no engine for model " + strconv.Quote(model) + " started within " + p.p.Hold.String() +
				" (scale_to_zero.hold); it may still be starting", retryAfter: coldStartRetryAfter}
		next, err = r, r
	default:
		r := g.contextRefusal(c, "deadline expired while waiting for an engine of the model to start")
		next, err = r, r
	}
	endSpan(sp, err)
	return next
}

// waitForEngine waits until model has a routable worker (HoldServed), the
// hold passes (HoldTimeout) or ctx ends (HoldCancelled), waking at every
// change of the pool.
func (g *Gateway) waitForEngine(ctx context.Context, model string, hold time.Duration) string {
	timer := time.NewTimer(hold)
	defer timer.Stop()
	for {
		changed := g.cold.next() // before the look: a change after it wakes the wait
		if len(g.candidates(model)) > 0 {
			return metrics.HoldServed
		}
		select {
		case <-changed:
		case <-timer.C:
			return metrics.HoldTimeout
		case <-ctx.Done():
			return metrics.HoldCancelled
		}
	}
}
