package gateway

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// The gateway asks the federation (Config.Federation) at four points of a
// request, each with what it knows by then: with no local candidate (before
// admission), when local admission is saturated or its wait over budget
// (before admission, so a request that leaves takes no local slot), after
// the local worker is chosen, with the prompt's cached prefix there (its
// admission slot is then given back before the request leaves), and when
// every local attempt failed before its first byte (as with no local
// candidate). Each answer naming a datacenter is a planRemote whose then
// plan is what the request does when the other datacenter failed before
// its first byte: the local plan it would have had, or the local error.

// federating reports whether the federation may route this request.
func (g *Gateway) federating(ctx context.Context) bool {
	return g.cfg.Federation != nil && !federation.Forwarded(ctx) && g.cfg.Federation.Settings().Enabled
}

// federateEarly asks before admission; ok when another datacenter should
// serve the request.
func (g *Gateway) federateEarly(c *call, healthy bool) (d federation.Decision, ok bool) {
	if !g.federating(c.ctx) {
		return d, false
	}
	x := c.x
	l := federation.Local{Healthy: healthy}
	if healthy {
		l.Saturated, l.QueueWait = g.localPressure(x.req.Model, x.pol.Limits)
		if !l.Saturated && l.QueueWait <= g.cfg.Federation.Settings().QueueWaitBudget {
			return d, false
		}
	}
	d = g.cfg.Federation.Route(federation.Request{Model: x.req.Model, Local: l})
	return d, d.DC != ""
}

// federateChosen asks once p's worker is chosen locally: a planRemote
// falling back to p, or nil when the request stays. A request that stays is
// remembered in the local datacenter's hot prefixes.
func (g *Gateway) federateChosen(c *call, p planWorker) plan {
	if !g.federating(c.ctx) {
		return nil
	}
	x, wk := c.x, p.wk
	keys, matched, ok := x.req.PrefixResult(wk.ID)
	if !ok || len(keys) == 0 {
		return nil
	}
	bs := wk.BlockSize
	if bs <= 0 {
		bs = scoring.DefaultBlockSize
	}
	fed := g.cfg.Federation
	uncached, _ := x.req.UncachedTokens(wk)
	cached := int64(matched) * int64(bs)
	d := fed.Route(federation.Request{Model: x.req.Model, Keys: keys, BlockSize: bs,
		Local: federation.Local{Healthy: true, CachedTokens: cached, PromptTokens: cached + uncached,
			PrefillRate: wk.Signals().PrefillRate}})
	if d.DC != "" {
		return &planRemote{d: d, keys: keys, then: p}
	}
	fed.Observe(x.req.Model, keys)
	return nil
}

// federateFailed asks once every local attempt failed before its first
// byte: the request is then as one without a local worker, and need not
// wait for discovery to drop the dead ones (a health check's interval).
func (g *Gateway) federateFailed(c *call) (d federation.Decision, ok bool) {
	if !g.federating(c.ctx) {
		return d, false
	}
	d = g.cfg.Federation.Route(federation.Request{Model: c.x.req.Model, Local: federation.Local{Healthy: false}})
	return d, d.DC != ""
}

// runRemote sends the request to a router in the datacenter p names,
// giving its local admission slot back first. When that fails before
// anything reached the client, the next plan is p.then.
func (g *Gateway) runRemote(c *call, p *planRemote) plan {
	x := c.x
	x.releaseSlot() // the local slot is not needed there
	if next, done := g.forwardRemote(c, p.d); done {
		return next
	}
	if p.keys != nil {
		g.cfg.Federation.Observe(x.req.Model, p.keys)
	}
	return p.then
}

// forwardRemote forwards the request to the datacenter d names; done is
// false when that failed before anything reached the client.
func (g *Gateway) forwardRemote(c *call, d federation.Decision) (next plan, done bool) {
	fed, dc, x, rec := g.cfg.Federation, d.DC, c.x, c.rec
	tg, err := fed.Begin(d, x.req.Model)
	if err != nil {
		return nil, false
	}
	wk := &scoring.Worker{ID: "dc:" + dc, Model: x.req.Model, Engine: "oasis-router", Role: "both",
		Address: tg.Addr, Live: tg.Live}
	x.remote = &tg
	defer func() { x.remote = nil }()
	rec.worker = wk.ID
	err = g.forward(c, wk, true)
	switch {
	case err == nil:
		fed.End(dc, true)
		return nil, true
	case c.ctx.Err() != nil:
		return g.contextRefusal(c, "deadline expired before the other datacenter answered"), true
	}
	fed.End(dc, false)
	rec.ws, rec.worker = nil, ""
	g.log.Warn("forwarding to another datacenter failed before the first byte; serving locally",
		"model", x.req.Model, "dc", dc, "peer", tg.Addr, "request_id", x.reqID, "error", err)
	return nil, false
}

// remoteRequest adjusts a request to another datacenter's router: its
// federation listener authenticates this router by certificate (the
// client's API key stays here), and the deadline left is cut by the round
// trip so the remote gives up before this router does.
func (g *Gateway) remoteRequest(ctx context.Context, up *http.Request, tg *federation.Target) {
	up.URL.Scheme, up.URL.Host, up.Host = "https", tg.Addr, ""
	up.Header.Del("Authorization")
	up.Header.Set(federation.FromHeader, g.cfg.Federation.DC())
	up.Header.Del(DeadlineHeader)
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl) - tg.RTT
		up.Header.Set(DeadlineHeader, strconv.FormatInt(max(left.Milliseconds(), 1), 10))
	}
}

// localPressure is whether local admission of model would refuse a request
// now (its queue is full), and the estimated wait for a slot: the requests
// ahead of it times the model's mean service time, over its slots (this
// router's share of max_in_flight when the datacenter's routers share it).
func (g *Gateway) localPressure(model string, lim policy.Limits) (saturated bool, wait time.Duration) {
	if lim.MaxInFlight <= 0 {
		return false, 0 // uncapped: admission never waits
	}
	slots := max(g.cfg.Admission.Cap(model, lim), 1)
	inflight, queued := g.cfg.Admission.InFlight(model), g.cfg.Admission.Queued(model)
	if queued >= lim.MaxQueue && inflight >= slots {
		return true, lim.QueueTimeout
	}
	if inflight < slots {
		return false, 0
	}
	mean := g.service.mean(model)
	return false, time.Duration(float64(queued+1) * float64(mean) / float64(slots))
}

// FederationSummary is this datacenter's per-model figures for the
// federation's summaries (federation.Config.Local).
func (g *Gateway) FederationSummary() []federation.ModelSummary {
	doc := g.cfg.Policy.Current()
	var out []federation.ModelSummary
	for _, model := range g.cfg.Pool.Models() {
		ws := g.candidates(model)
		if len(ws) == 0 {
			continue
		}
		lim := doc.For(model).Limits
		inflight, queued := g.cfg.Admission.InFlight(model), g.cfg.Admission.Queued(model)
		free := uint32(federation.FreeUnlimited)
		if lim.MaxInFlight > 0 {
			free = uint32(max(g.cfg.Admission.Cap(model, lim)-inflight, 0))
		}
		ttft := time.Duration(math.MaxInt64)
		for _, wk := range ws {
			ttft = min(ttft, wk.Signals().EstimatedTTFT(0))
		}
		_, wait := g.localPressure(model, lim)
		out = append(out, federation.ModelSummary{Model: model, InFlight: uint32(max(inflight, 0)),
			Queued: uint32(max(queued, 0)), Free: free, TTFT: ttft, QueueWait: wait})
	}
	return out
}

// serviceTimes keeps each model's mean request duration (exponentially
// weighted), for the admission wait estimate.
type serviceTimes struct{ m sync.Map } // model → *atomic.Int64 (nanoseconds)

func (s *serviceTimes) observe(model string, d time.Duration) {
	v, ok := s.m.Load(model)
	if !ok {
		v, _ = s.m.LoadOrStore(model, new(atomic.Int64))
	}
	p := v.(*atomic.Int64)
	for {
		old := p.Load()
		next := int64(d)
		if old > 0 {
			next = old + (int64(d)-old)/16
		}
		if p.CompareAndSwap(old, next) {
			return
		}
	}
}

func (s *serviceTimes) mean(model string) time.Duration {
	if v, ok := s.m.Load(model); ok {
		return time.Duration(v.(*atomic.Int64).Load())
	}
	return time.Second // nothing measured yet: a guess, not a promise
}
