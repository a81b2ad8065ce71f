package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/oasis-llm/oasis/router/scoring"
)

// The SGLang protocol, as SGLang's own load balancers run it
// (sgl-project/sglang python/sglang/srt/disaggregation/mini_lb.py, and
// sgl-router's PD router, sgl-router/src/routers/http/pd_router.rs): both
// legs are the client's body plus bootstrap_host (the prefill instance's
// host), bootstrap_port (its bootstrap server, oasis_bootstrap_port) and
// bootstrap_room (a random 63-bit integer naming the transfer), sent at
// once; the decode engine pulls the KV from the prefill engine's bootstrap
// server. The decode leg's answer is the client's; the prefill leg's is
// read to its end and dropped.

// sglangBody is both legs' body.
func sglangBody(body []byte, pw *scoring.Worker) ([]byte, error) {
	host, _, err := net.SplitHostPort(pw.Address)
	if err != nil {
		return nil, err
	}
	h, _ := json.Marshal(host)
	return withFields(body, map[string]json.RawMessage{
		"bootstrap_host": h,
		"bootstrap_port": json.RawMessage(strconv.Itoa(pw.BootstrapPort)),
		"bootstrap_room": json.RawMessage(strconv.FormatInt(rand.Int64(), 10)), // [0, 2⁶³)
	})
}

// sglangPair sends both legs at once and relays the decode leg. A prefill
// leg that fails before its response head cancels the decode leg, and the
// attempt is the prefill's failure (retried on another prefill worker);
// once the decode leg failed, or the client left, the prefill leg is
// cancelled too.
func (g *Gateway) sglangPair(c *call, pair scoring.Pair, mayRetry bool) error {
	body, err := sglangBody(c.x.body, pair.Prefill)
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
