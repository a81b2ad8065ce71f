package gateway

// Disaggregated prefill/decode. For a model served by prefill workers
// (oasis_role=prefill) and decode workers (oasis_role=decode) the router
// chooses a prefill worker and a decode worker together (scoring.PickPair)
// and hands the request from one to the other by the pair's protocol
// (oasis_pd_protocol):
//
//   - vllm (NixlConnector, LMCache, MultiConnector): a prefill leg with
//     max_tokens 1 and kv_transfer_params {do_remote_decode: true} first;
//     its answer's kv_transfer_params go unchanged into the decode leg,
//     which is the client's body otherwise (pd_vllm.go).
//   - sglang (bootstrap server): both legs at once, each the client's body
//     with bootstrap_host, bootstrap_port and bootstrap_room; the decode
//     leg's answer is the client's, the prefill leg's is drained (pd_sglang.go).
//
// A prompt with few uncached tokens on the chosen decode worker goes to a
// direct candidate instead (policy disaggregation_min_uncached_tokens).
// Failures: a failed prefill leg is retried on another prefill worker
// (maxPrefillAttempts in all), then served without a remote prefill when
// the policy allows (disaggregation_fallback "local"); a decode leg that
// fails before the client's first byte is retried once with a new pair
// (retryPair: it may be the prefill worker's failure);
// nothing is retried after bytes reached the client.

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"time"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/scoring"
)

// maxPrefillAttempts bounds the prefill legs of one pair attempt.
const maxPrefillAttempts = 2

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

// directWorker reports whether w serves a request by itself: not a prefill
// worker, nor an SGLang decode worker (which waits for a prefill peer's KV).
func directWorker(w *scoring.Worker) bool {
	return w.Role != discovery.RolePrefill &&
		(w.Role != discovery.RoleDecode || w.PDProtocol != discovery.ProtocolSGLang)
}

// pdWorkers splits model's workers into prefill and decode sides and tells
// whether any may serve directly; nil sides (no allocation) when the model
// has no prefill worker.
func (g *Gateway) pdWorkers(model string) (prefill, decode []*scoring.Worker, direct bool) {
	ws := routable(g.cfg.Pool.Workers(model), time.Now())
	if !slices.ContainsFunc(ws, func(w *scoring.Worker) bool { return w.Role == discovery.RolePrefill }) {
		return nil, nil, true
	}
	for _, w := range ws {
		switch w.Role {
		case discovery.RolePrefill:
			prefill = append(prefill, w)
		case discovery.RoleDecode:
			decode = append(decode, w)
		}
		direct = direct || directWorker(w)
	}
	return prefill, decode, direct
}

// disaggregate serves the request through a prefill/decode pair when the
// model has one and the policy wants it; false leaves the request to the
// direct path (attempt).
func (g *Gateway) disaggregate(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, x *exchange) bool {
	if !x.pol.Disagg.Enabled || x.remote != nil || x.req.Path == "/v1/embeddings" {
		return false // an embedding has no decode
	}
	prefill, decode, direct := g.pdWorkers(x.req.Model)
	if len(prefill) == 0 || len(decode) == 0 {
		return false
	}
	t0 := time.Now()
	dctx, dsp := rec.tr.start(ctx, SpanRoute)
	pair, err := g.cfg.Selector.PickPair(dctx, x.req, prefill, decode)
	g.m.RoutingDecision.Observe(time.Since(t0).Seconds())
	if err == nil {
		rec.tr.pairDecided(dsp, pair)
	}
	endSpan(dsp, err)
	if err != nil {
		return false // no two workers share a protocol
	}
	if direct && uncachedOn(x, pair.Decode) < int64(x.pol.Disagg.MinUncachedTokens) {
		g.m.DisaggRequests.WithLabelValues(x.req.Model, "direct").Inc()
		return false
	}
	g.pairs(ctx, w, r, rec, x, pair, prefill, decode, direct)
	return true
}

// uncachedOn is the prompt's tokens not in wk's cache by the router's
// prefix index, or, without prompt tokens (no tokenizer), the prompt's
// length estimated from the body (≈4 bytes a token).
func uncachedOn(x *exchange, wk *scoring.Worker) int64 {
	if n, ok := x.req.UncachedTokens(wk); ok {
		return n
	}
	return int64(len(x.body) / 4)
}

// pairs serves the request through pair, and once more through a new pair
// when the decode leg failed before the first byte.
func (g *Gateway) pairs(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, x *exchange,
	pair scoring.Pair, prefill, decode []*scoring.Worker, direct bool) {
	g.m.DisaggRequests.WithLabelValues(x.req.Model, "pair").Inc()
	var failedP, triedD []*scoring.Worker
	for n := 0; ; n++ {
		triedD = append(triedD, pair.Decode)
		g.notePick(ctx, x, pair.Prefill)
		g.notePick(ctx, x, pair.Decode)
		err := g.pairAttempt(ctx, w, r, rec, x, &pair, prefill, &failedP, n == 0)
		var pe *prefillError
		var la *legAnswer
		var ue *upstreamError
		switch {
		case err == nil:
			return
		case ctx.Err() != nil:
			g.contextFailed(w, r, rec, "deadline expired before the engine answered")
			return
		case errors.As(err, &la):
			relayAnswer(w, rec, la)
			return
		case errors.As(err, &pe):
			g.prefillFailed(ctx, w, r, rec, x, pe, direct)
			return
		case !errors.As(err, &ue):
			rec.fail(w, http.StatusInternalServerError, "server_error", "internal_error", "", "building the upstream request failed", 0)
			return
		}
		g.m.DisaggFailures.WithLabelValues(x.req.Model, "decode").Inc()
		var next scoring.Pair
		perr := scoring.ErrNoWorker
		if n == 0 {
			next, perr = g.retryPair(ctx, x, pair, without(prefill, failedP), decode, triedD)
		}
		if perr != nil {
			reason := ""
			if n == 0 {
				reason = "; no other prefill/decode pair is available"
			}
			upstreamFailed(w, rec, ue, reason)
			return
		}
		g.m.Retries.WithLabelValues(x.req.Model).Inc()
		rec.tr.retried()
		g.log.Warn("decode leg failed before the first token; retrying with a new pair", "model", x.req.Model,
			"decode", pair.Decode.ID, "request_id", x.reqID, "error", err)
		pair = next
	}
}

// retryPair chooses the pair for the retry after a decode leg failed before
// the first byte. The failure may be the prefill worker's: a decode engine
// whose prefill peer died after answering the prefill leg (or, SGLang,
// after its response head) fails the KV pull and answers 5xx. So the retry
// prefers a pair that shares neither worker with the failed one, then
// another decode worker with the same prefill worker, then the same decode
// worker with another prefill worker (a model with one decode worker).
func (g *Gateway) retryPair(ctx context.Context, x *exchange, failed scoring.Pair, prefill, decode,
	triedD []*scoring.Worker) (scoring.Pair, error) {
	otherP := without(prefill, []*scoring.Worker{failed.Prefill})
	otherD := without(decode, triedD)
	next, err := g.cfg.Selector.PickPair(ctx, x.req, otherP, otherD)
	if err != nil {
		next, err = g.cfg.Selector.PickPair(ctx, x.req, prefill, otherD)
	}
	if err != nil {
		next, err = g.cfg.Selector.PickPair(ctx, x.req, otherP, []*scoring.Worker{failed.Decode})
	}
	return next, err
}

// pairAttempt runs one pair by its protocol. prefill are the prefill
// workers a failed prefill leg may move to (pair.Prefill is the last one
// tried); failed collects those that failed.
func (g *Gateway) pairAttempt(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, x *exchange,
	pair *scoring.Pair, prefill []*scoring.Worker, failed *[]*scoring.Worker, mayRetry bool) error {
	var last *upstreamError
	for i := 0; i < maxPrefillAttempts; i++ {
		if i > 0 {
			next, err := g.cfg.Selector.PickPair(ctx, x.req, without(prefill, *failed), []*scoring.Worker{pair.Decode})
			if err != nil {
				break
			}
			pair.Prefill = next.Prefill
			g.notePick(ctx, x, pair.Prefill)
		}
		var err error
		if pair.Decode.PDProtocol == discovery.ProtocolSGLang {
			err = g.sglangPair(ctx, w, r, rec, x, *pair, mayRetry)
		} else {
			err = g.vllmPair(ctx, w, r, rec, x, *pair, mayRetry)
		}
		var pf *prefillLegError
		if !errors.As(err, &pf) || ctx.Err() != nil {
			return err
		}
		last = pf.err
		*failed = append(*failed, pair.Prefill)
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

// prefillFailed answers a request whose prefill legs all failed: served
// without a remote prefill by the direct candidates when the policy allows
// it, else the last prefill failure is the client's answer.
func (g *Gateway) prefillFailed(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, x *exchange,
	pe *prefillError, direct bool) {
	if !x.pol.Disagg.Fallback || !direct {
		upstreamFailed(w, rec, pe.last, "; the prefill failed on every prefill worker tried")
		return
	}
	g.m.DisaggRequests.WithLabelValues(x.req.Model, "fallback").Inc()
	g.log.Warn("every prefill leg failed; serving without a remote prefill", "model", x.req.Model,
		"request_id", x.reqID, "error", pe.last)
	g.attempt(ctx, w, r, rec, x)
}

// notePick tells Config.OnPick about a worker chosen for a leg.
func (g *Gateway) notePick(ctx context.Context, x *exchange, wk *scoring.Worker) {
	if g.cfg.OnPick != nil {
		g.cfg.OnPick(ctx, x.pol.Scoring, x.req, wk)
	}
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

// without returns ws less the workers in out (a new slice).
func without(ws, out []*scoring.Worker) []*scoring.Worker {
	return slices.DeleteFunc(slices.Clone(ws), func(w *scoring.Worker) bool {
		return slices.ContainsFunc(out, func(o *scoring.Worker) bool { return o.ID == w.ID })
	})
}
