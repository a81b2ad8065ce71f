package gateway

import (
	"encoding/json"
	"math"
	"net/http"
	"slices"
	"time"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Why a request overflowed (the reason label of
// oasis_router_overflow_requests_total and the X-Oasis-Overflow header).
const (
	reasonQueueFull    = "queue_full"    // admission's queue was full (else 429)
	reasonQueueTimeout = "queue_timeout" // no slot within queue_timeout (else 503)
	reasonNoWorker     = "no_worker"     // no healthy local worker (else 503)
	reasonTTFT         = "ttft_over"     // estimated TTFT above the bound
)

// OverflowHeader names why a request was sent to its model's overflow pool.
const OverflowHeader = "X-Oasis-Overflow"

// localFirst leaves hosted workers out of a model's candidates while local
// ones exist, unless the policy makes them peers.
func (g *Gateway) localFirst(model string, ws []*scoring.Worker) []*scoring.Worker {
	if g.cfg.Policy.Current().HostedPeersFor(model) {
		return ws
	}
	local := slices.DeleteFunc(slices.Clone(ws), func(w *scoring.Worker) bool { return w.Upstream != "" })
	if len(local) == 0 {
		return ws
	}
	return local
}

// overflowEarly reports whether c should overflow before admission: its
// model's policy bounds the estimated time to first token and the local
// pool's estimate exceeds it.
func (g *Gateway) overflowEarly(c *call) bool {
	o, ok := g.cfg.Policy.Current().OverflowFor(c.x.req.Model)
	return ok && o.TTFTOver && g.estimatedTTFT(c.x).Seconds() > o.TTFTSeconds
}

// estimatedTTFT is the local pool's estimated time to first token for x: the
// wait for an admission slot plus the best worker's prefill queue and prompt.
func (g *Gateway) estimatedTTFT(x *exchange) time.Duration {
	saturated, wait := g.localPressure(x.req.Model, x.pol.Limits)
	if saturated {
		return time.Duration(math.MaxInt64)
	}
	best := time.Duration(math.MaxInt64)
	prompt := int64(len(x.body) / 4)
	for _, wk := range g.candidates(x.req.Model) {
		best = min(best, wk.Signals().EstimatedTTFT(prompt))
	}
	if best == time.Duration(math.MaxInt64) {
		return best
	}
	return wait + best
}

// overflowOr is the plan that sends c to its model's overflow pool, with
// the model name that pool's API uses, or otherwise when the model has no
// overflow or the pool no worker: the local answer (429, 503) stands. Only
// ever chosen before a request reached a worker, so no answer has started.
// A Responses API request never overflows (call.localOnly).
func (g *Gateway) overflowOr(c *call, reason string, otherwise plan) plan {
	x := c.x
	o, ok := g.cfg.Policy.Current().OverflowFor(x.req.Model)
	if !ok || c.localOnly() || o.Pool == x.req.Model || len(g.cfg.Pool.Workers(o.Pool)) == 0 {
		return otherwise
	}
	body, err := openai.WithFields(x.body, map[string]json.RawMessage{"model": openai.String(o.Model)})
	if err != nil {
		return otherwise
	}
	ox, err := g.derive(c.r, x, o.Pool, body)
	if err != nil {
		return otherwise
	}
	return &planOverflow{x: ox, reason: reason}
}

// runOverflow serves p's request in the overflow pool, answering the client
// from there.
func (g *Gateway) runOverflow(c *call, p *planOverflow) {
	x := c.x
	g.m.Overflowed.WithLabelValues(x.req.Model, p.reason).Inc()
	g.log.Debug("overflowing request", "model", x.req.Model, "pool", p.x.req.Model, "reason", p.reason,
		"request_id", x.reqID)
	c.w.Header().Set(OverflowHeader, p.reason)
	c.rec.model = p.x.req.Model
	g.serve(c.with(p.x))
}

// derive returns an exchange like x for another model (the pool it goes to)
// and body (the client's, rewritten).
func (g *Gateway) derive(r *http.Request, x *exchange, model string, body []byte) (*exchange, error) {
	f, err := parseBody(r, body)
	if err != nil {
		return nil, err
	}
	req := &scoring.Request{Model: model, Path: r.URL.Path, Body: body, Stream: f.Stream, Prompt: f.Prompt,
		EstimatedTokens: estimateTokens(len(body), f)}
	return &exchange{req: req, fields: f, body: body, reqID: x.reqID, pol: g.cfg.Policy.Current().For(model)}, nil
}
