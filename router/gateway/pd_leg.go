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

// leg returns a copy of x that sends body instead of the client's (see
// exchange.remotePrefill).
func (x *exchange) leg(body []byte) *exchange {
	lx := *x
	lx.body = body
	return &lx
}

// prefillCall is a prefill leg in flight: its response head arrived with a
// 2xx status. end must be called once the body is read or abandoned.
type prefillCall struct {
	resp *http.Response
	pre  *scoring.Prefill
	sent time.Time
	end  func()
}

// startPrefill sends a prefill leg to pw and waits for its response head,
// within the policy's response_header timeout, which also bounds the read
// of its body. A failure before a 2xx head is a *prefillLegError, a 4xx
// answer a *legAnswer; either way nothing reached the client.
func (g *Gateway) startPrefill(ctx context.Context, r *http.Request, lx *exchange, pw *scoring.Worker) (*prefillCall, error) {
	tokens := lx.req.EstimatedTokens
	pw.Live.Enter(tokens)
	ws := g.series(pw)
	ws.InFlight.Inc()
	var pre *scoring.Prefill
	if n, ok := lx.req.UncachedTokens(pw); ok {
		pre = g.beginPrefill(lx.req.Model, pw, n)
	}
	ctx, sp := g.tr.attempt(ctx, SpanPrefill, pw)
	lctx, cancel := context.WithTimeoutCause(ctx, orNever(lx.pol.Timeouts.ResponseHeader), errResponseHeaderTimeout)
	end := func() {
		sp.End()
		cancel()
		pre.Cancel()
		ws.InFlight.Dec()
		pw.Live.Leave(tokens)
	}
	call, err := g.prefillHead(lctx, r, lx, pw)
	if err != nil {
		endSpan(sp, err)
		end()
		return nil, err
	}
	call.pre, call.end = pre, end
	return call, nil
}

// prefillHead sends the leg and classifies its response head.
func (g *Gateway) prefillHead(lctx context.Context, r *http.Request, lx *exchange, pw *scoring.Worker) (*prefillCall, error) {
	up, rt, err := g.upstreamRequest(lctx, r, lx, pw)
	if err != nil {
		return nil, err
	}
	sent := time.Now()
	resp, err := rt.RoundTrip(up)
	if err != nil {
		unreachable := isConnectError(err)
		if unreachable {
			g.connectFailed(pw, lx.reqID)
		}
		return nil, g.legFailed(lctx, lx, err, unreachable)
	}
	g.connected(pw)
	if resp.StatusCode/100 == 2 {
		if g.cfg.OnAccept != nil {
			g.cfg.OnAccept(lctx, lx.pol.Scoring, lx.req, pw)
		}
		return &prefillCall{resp: resp, sent: sent}, nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, pd.MaxLegAnswer))
	if resp.StatusCode/100 == 4 && err == nil {
		return nil, &legAnswer{status: resp.StatusCode, header: resp.Header, body: body}
	}
	return nil, &prefillLegError{&upstreamError{err: errors.New("prefill engine answered " + resp.Status)}}
}

// legFailed turns a prefill leg's transport error into its *prefillLegError
// (or the client's context error).
func (g *Gateway) legFailed(lctx context.Context, lx *exchange, err error, unreachable bool) error {
	if errors.Is(context.Cause(lctx), errResponseHeaderTimeout) {
		g.m.UpstreamTimeouts.WithLabelValues(lx.req.Model, "response_header").Inc()
		return &prefillLegError{&upstreamError{err: errors.New("prefill leg: " + errResponseHeaderTimeout.Error()), timeout: true}}
	}
	return &prefillLegError{&upstreamError{err: err, unreachable: unreachable}}
}
