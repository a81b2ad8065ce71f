package gateway

import (
	"context"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/oasis-llm/oasis/router/pd"
	"github.com/oasis-llm/oasis/router/scoring"
)

// The SGLang protocol (router/pd/sglang.go): both legs at once, the decode
// leg relayed, the prefill leg drained.

// sglangPair sends both legs at once and relays the decode leg. A prefill
// leg that fails before its response head cancels the decode leg, and the
// attempt is the prefill's failure (retried on another prefill worker);
// once the decode leg failed, or the client left, the prefill leg is
// cancelled too.
func (g *Gateway) sglangPair(c *call, pair scoring.Pair, mayRetry bool) error {
	body, err := pd.SGLangBody(c.x.body, pair.Prefill)
	if err != nil {
		return err
	}
	lx, r := c.x.leg(body), c.r
	dctx, cancelDecode := context.WithCancelCause(c.ctx)
	defer cancelDecode(nil)
	// The prefill leg may outlive the handler while its answer drains: its
	// context is not the client's, and startPrefill bounds it.
	pctx, cancelPrefill := context.WithCancel(context.WithoutCancel(c.ctx))
	prefillDone := make(chan struct{})
	go func() {
		defer close(prefillDone)
		defer cancelPrefill()
		g.sglangPrefill(pctx, r, lx, pair.Prefill, cancelDecode)
	}()

	c.rec.worker = pair.Decode.ID
	dc := *c
	dc.ctx, dc.x = dctx, lx
	err = g.forward(&dc, pair.Decode, mayRetry)
	if err == nil {
		return nil
	}
	// Read the cause before cancelling the prefill leg: the decode leg
	// failed by itself unless the prefill leg's failure cancelled it.
	cause := context.Cause(dctx)
	cancelPrefill() // the KV has no taker now
	<-prefillDone
	var pf *prefillLegError
	var la *legAnswer
	if errors.As(cause, &pf) || errors.As(cause, &la) {
		return cause
	}
	return err
}

// sglangPrefill runs the prefill leg to its end, cancelling the decode leg
// with the failure when it fails before a 2xx head.
func (g *Gateway) sglangPrefill(ctx context.Context, r *http.Request, lx *exchange, pw *scoring.Worker,
	cancelDecode context.CancelCauseFunc) {
	call, err := g.startPrefill(ctx, r, lx, pw)
	if err != nil {
		if ctx.Err() == nil { // not cancelled by sglangPair
			cancelDecode(err)
		}
		return
	}
	defer call.end()
	g.m.PrefillLeg.WithLabelValues(lx.req.Model).Observe(time.Since(call.sent).Seconds())
	_, _ = io.Copy(io.Discard, call.resp.Body)
	call.resp.Body.Close()
}
