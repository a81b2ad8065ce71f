package gateway

// Disaggregated prefill/decode, the gateway's side (router/pd has the
// rest): the pair plan, its execution and retries; the legs' requests are
// in pd_leg.go, pd_vllm.go and pd_sglang.go.

import (
	"errors"
	"net/http"
	"time"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/pd"
	"github.com/oasis-llm/oasis/router/scoring"
)

// prefillError is a pair attempt whose every prefill leg failed before the
// client saw anything: the request may still be served without a remote
// prefill.
type prefillError struct{ last *upstreamError }

func (e *prefillError) Error() string { return "prefill failed: " + e.last.Error() }
func (e *prefillError) Unwrap() error { return e.last }

// legAnswer is a leg's 4xx answer: the client's request is at fault, so it
// is the client's answer, never retried.
type legAnswer struct {
	status int
	header http.Header
	body   []byte
}

func (e *legAnswer) Error() string {
	return "the engine refused the request: " + http.StatusText(e.status)
}

// routePair is the plan for a request its model's prefill/decode pairs
// should serve, when the model has them and the policy wants one; nil
// leaves it to a direct worker (pick).
func (g *Gateway) routePair(c *call) plan {
	x := c.x
	if !x.pol.Disagg.Enabled || x.remote != nil || !generates(x.req.Path) {
		return nil // an embedding (a score, a tokenization...) has no decode
	}
	prefill, decode, direct := pd.Split(routable(g.cfg.Pool.Workers(x.req.Model), time.Now()))
	if len(prefill) == 0 || len(decode) == 0 {
		return nil
	}
	t0 := time.Now()
	dctx, dsp := c.rec.tr.start(c.ctx, SpanRoute)
	pair, err := g.cfg.Selector.PickPair(dctx, x.req, prefill, decode)
	g.m.RoutingDecision.Observe(time.Since(t0).Seconds())
	p := &planPair{pair: pair, prefill: prefill, decode: decode, direct: direct}
	if err == nil {
		c.rec.tr.pairDecided(dsp, p)
	}
	endSpan(dsp, err)
	if err != nil {
		return nil // no two workers share a protocol
	}
	if direct && pd.Uncached(x.req, x.body, pair.Decode) < int64(x.pol.Disagg.MinUncachedTokens) {
		g.m.DisaggRequests.WithLabelValues(x.req.Model, "direct").Inc()
		return nil
	}
	g.m.DisaggRequests.WithLabelValues(x.req.Model, "pair").Inc()
	return p
}

// runPair serves the request through p's pair. When its decode leg failed
// before the first byte, the next plan is a new pair (the first time);
// when every prefill leg failed, prefillFailed's.
func (g *Gateway) runPair(c *call, st *attempts, p *planPair) plan {
	x := c.x
	p.triedD = append(p.triedD, p.pair.Decode)
	g.notePick(c, p.pair.Prefill)
	g.notePick(c, p.pair.Decode)
	err := g.pairAttempt(c, p)
	var pe *prefillError
	var la *legAnswer
	var ue *upstreamError
	switch {
	case err == nil:
		return nil
	case c.ctx.Err() != nil:
		return g.contextRefusal(c, "deadline expired before the engine answered")
	case errors.As(err, &la):
		relayAnswer(c.w, c.rec, la)
		return nil
	case errors.As(err, &pe):
		return g.prefillFailed(c, st, pe, p.direct)
	case !errors.As(err, &ue):
		return internalError("internal_error", "building the upstream request failed")
	}
	g.m.DisaggFailures.WithLabelValues(x.req.Model, "decode").Inc()
	if p.retry > 0 {
		return upstreamRefusal(ue, "")
	}
	next, perr := pd.RetryPair(c.ctx, g.cfg.Selector, x.req, p.pair, pd.Without(p.prefill, p.failedP), p.decode, p.triedD)
	if perr != nil {
		return upstreamRefusal(ue, "; no other prefill/decode pair is available")
	}
	g.m.Retries.WithLabelValues(x.req.Model).Inc()
	c.rec.tr.retried()
	g.log.Warn("decode leg failed before the first token; retrying with a new pair", "model", x.req.Model,
		"decode", p.pair.Decode.ID, "request_id", x.reqID, "error", err)
	return &planPair{pair: next, prefill: p.prefill, decode: p.decode, direct: p.direct, retry: p.retry + 1,
		failedP: p.failedP, triedD: p.triedD}
}

// pairAttempt runs p's pair by its protocol. A failed prefill leg moves
// to another of p's prefill workers (p.pair.Prefill is the last one tried);
// p.failedP collects those that failed.
func (g *Gateway) pairAttempt(c *call, p *planPair) error {
	x, pair := c.x, &p.pair
	var last *upstreamError
	for i := 0; i < pd.MaxPrefillAttempts; i++ {
		if i > 0 {
			next, err := g.cfg.Selector.PickPair(c.ctx, x.req, pd.Without(p.prefill, p.failedP), []*scoring.Worker{pair.Decode})
			if err != nil {
				break
			}
			pair.Prefill = next.Prefill
			g.notePick(c, pair.Prefill)
		}
		var err error
		if pair.Decode.PDProtocol == discovery.ProtocolSGLang {
			err = g.sglangPair(c, *pair, p.retry == 0)
		} else {
			err = g.vllmPair(c, *pair, p.retry == 0)
		}
		var pf *prefillLegError
		if !errors.As(err, &pf) || c.ctx.Err() != nil {
			return err
		}
		last = pf.err
		p.failedP = append(p.failedP, pair.Prefill)
		g.m.DisaggFailures.WithLabelValues(x.req.Model, "prefill").Inc()
		g.log.Warn("prefill leg failed", "model", x.req.Model, "prefill", pair.Prefill.ID,
			"request_id", x.reqID, "error", pf.err)
	}
	return &prefillError{last: last}
}

// prefillLegError is one prefill leg's failure, before the client saw anything.
type prefillLegError struct{ err *upstreamError }

func (e *prefillLegError) Error() string { return "prefill leg: " + e.err.Error() }
func (e *prefillLegError) Unwrap() error { return e.err }

// prefillFailed is the plan for a request whose prefill legs all failed:
// the direct workers, without a remote prefill, when the policy allows it,
// else the last prefill failure is the client's answer.
func (g *Gateway) prefillFailed(c *call, st *attempts, pe *prefillError, direct bool) plan {
	x := c.x
	if !x.pol.Disagg.Fallback || !direct {
		return upstreamRefusal(pe.last, "; the prefill failed on every prefill worker tried")
	}
	g.m.DisaggRequests.WithLabelValues(x.req.Model, "fallback").Inc()
	g.log.Warn("every prefill leg failed; serving without a remote prefill", "model", x.req.Model,
		"request_id", x.reqID, "error", pe.last)
	return g.pick(c, st)
}

// relayAnswer sends a leg's 4xx answer to the client.
func relayAnswer(w http.ResponseWriter, rec *outcome, a *legAnswer) {
	h := w.Header()
	copyEndToEnd(h, a.header)
	h.Del("Content-Length")
	rec.status = a.status
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}
