package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/scoring"
)

// migrate continues the stream rl relays, whose engine failed (ms), on
// other engines, up to the model's migration_limit continuations; past it,
// or with no engine left, the stream ends with the error event. It returns
// nil: the client has its answer either way.
func (g *Gateway) migrate(c *call, rl *relay, ms *migrateSignal) error {
	x := c.x
	model := x.req.Model
	failed := []*scoring.Worker{rl.wk}
	for n := 0; ; n++ { // n: continuations tried, answered or not
		if c.ctx.Err() != nil {
			rl.broken(c.ctx, c.ctx, c.r, c.ctx.Err()) // the client left (499) or the deadline passed
			return nil
		}
		if n >= x.pol.MigrationLimit {
			return g.migrationFailed(c, rl, ms, metrics.MigrationLimit)
		}
		next, err := rl.mig.continuation(x)
		if err != nil {
			return g.migrationFailed(c, rl, ms, metrics.MigrationNotContinuable)
		}
		wk := g.pickContinuation(c, rl, next, failed)
		if wk == nil {
			return g.migrationFailed(c, rl, ms, metrics.MigrationNoWorker)
		}
		if ms.reason == metrics.MigrationStreamIdle {
			g.m.UpstreamTimeouts.WithLabelValues(model, "stream_idle").Inc() // broken counts it when not migrated
		}
		g.m.Migrations.WithLabelValues(model, ms.reason).Inc()
		g.m.MigrationResentTokens.WithLabelValues(model).Add(float64(rl.mig.resent(c.ctx, next)))
		g.log.Warn("engine failed mid-stream; continuing the stream on another worker", "model", model,
			"from", rl.wk.ID, "to", wk.ID, "request_id", x.reqID, "reason", ms.reason,
			"tokens_sent", rl.mig.ngen, "error", ms.err)
		err = g.continueOn(c, rl, wk, next)
		if err == nil {
			return nil
		}
		failed = append(failed, wk)
		if !errors.As(err, &ms) {
			ms = &migrateSignal{reason: metrics.MigrationEngineFailed, err: err}
		}
	}
}

// migrationFailed ends a stream that cannot be continued with the error
// event of the engine failure ms.
func (g *Gateway) migrationFailed(c *call, rl *relay, ms *migrateSignal, why string) error {
	g.m.MigrationsFailed.WithLabelValues(c.x.req.Model, why).Inc()
	uctx, cancel := context.WithCancelCause(c.ctx)
	if ms.reason == metrics.MigrationStreamIdle {
		cancel(errStreamIdle) // broken reports the stall as such
	}
	defer cancel(nil)
	rl.broken(c.ctx, uctx, c.r, ms.err)
	return nil
}

// pickContinuation chooses the engine for the continuation next by the
// model's policy, among the workers of the failed engine's kind (token ids
// are its tokenizer's) that have not failed this stream.
func (g *Gateway) pickContinuation(c *call, rl *relay, next *exchange, failed []*scoring.Worker) *scoring.Worker {
	var cands []*scoring.Worker
	for _, w := range g.candidates(next.req.Model) {
		if idsKindOf(w) == rl.mig.kind && !containsWorker(failed, w) { // ids are the kind's tokenizer's
			cands = append(cands, w)
		}
	}
	if len(cands) == 0 {
		return nil
	}
	dctx, dsp := c.rec.tr.start(c.ctx, SpanRoute)
	d, err := g.cfg.Selector.Pick(dctx, next.pol.Scoring, next.req, cands)
	endSpan(dsp, err)
	if err != nil {
		return nil
	}
	return d.Worker
}

func containsWorker(ws []*scoring.Worker, w *scoring.Worker) bool {
	for _, v := range ws {
		if v == w || v.ID == w.ID {
			return true
		}
	}
	return false
}

// continueOn sends the continuation next to wk and relays its events into
// rl's stream. It returns nil when the stream ended (completed, or ended by
// the client), a *migrateSignal when wk failed too after answering, and
// another error when wk failed before its first event.
func (g *Gateway) continueOn(c *call, rl *relay, wk *scoring.Worker, next *exchange) (err error) {
	ctx, sp := g.tr.attempt(c.ctx, SpanMigrate, wk)
	sp.SetAttributes(AttrMigrationLeg.Int(rl.mig.leg+1), AttrResentTokens.Int(rl.mig.resent(ctx, next)))
	defer func() { endSpan(sp, err) }()
	tokens := next.req.EstimatedTokens
	wk.Live.Enter(tokens)
	defer wk.Live.Leave(tokens)
	ws := g.series(wk)
	ws.InFlight.Inc()
	defer ws.InFlight.Dec()
	uctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	up, rt, err := g.upstreamRequest(uctx, c.r, next, wk)
	if err != nil {
		return err
	}
	to := c.x.pol.Timeouts
	timer := newUpstreamTimer(cancel, to.ResponseHeader)
	defer timer.t.Stop()
	resp, err := rt.RoundTrip(up)
	if err != nil {
		if isConnectError(err) {
			g.connectFailed(wk, c.x.reqID)
		}
		return err
	}
	defer resp.Body.Close()
	g.connected(wk)
	if resp.StatusCode != http.StatusOK || !isEventStream(resp.Header) {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return errors.New("the continuation's engine answered " + resp.Status)
	}
	if g.cfg.OnAccept != nil {
		g.cfg.OnAccept(ctx, next.pol.Scoring, next.req, wk)
	}
	timer.streaming(to.StreamIdle)
	rl.mig.startLeg()
	c.rec.worker, c.rec.ws = wk.ID, ws
	rl.resp, rl.wk, rl.timer, rl.pending, rl.pre, rl.sent = resp, wk, timer, nil, nil, time.Now()
	return rl.run(c.ctx, uctx, c.r)
}
