package gateway

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"mime"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/router/cascade"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/scoring"
)

// upstreamError is an attempt that failed before anything reached the
// client: the caller may retry it on another worker.
type upstreamError struct {
	err     error
	timeout bool // response_header or stream_idle passed
	// unreachable: no connection could be made (refused, no route, or a
	// TLS handshake the engine's side refused, as a mesh sidecar does when
	// no intention lets the router in): the request never reached an engine.
	unreachable bool
	// loop: the engine answered 508 Loop Detected, as a router does to a
	// request that came back to it (hop.go): a registration points at a
	// router.
	loop bool
}

func (e *upstreamError) Error() string { return e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// Causes of an attempt's upstream context ending on the router's own timers.
var (
	errResponseHeaderTimeout = errors.New("no response head from the engine within the response_header timeout")
	errStreamIdle            = errors.New("no data from the engine within the stream_idle timeout")
)

// upstreamTimer cancels an attempt's upstream request when the engine is
// silent for too long: first waiting for the response head, then between
// two reads of the body. One timer per attempt, re-armed on every read.
type upstreamTimer struct {
	t    *time.Timer
	idle atomic.Bool // past the head: the stream_idle phase
}

// newUpstreamTimer arms the response-header timeout. A timeout ≤ 0 (a
// policy the validator never lets through) waits without bound rather than
// failing every request at once.
func newUpstreamTimer(cancel context.CancelCauseFunc, header time.Duration) *upstreamTimer {
	ut := &upstreamTimer{}
	ut.t = time.AfterFunc(orNever(header), func() {
		if ut.idle.Load() {
			cancel(errStreamIdle)
		} else {
			cancel(errResponseHeaderTimeout)
		}
	})
	return ut
}

// streaming switches to the stream_idle phase and re-arms the timer.
func (ut *upstreamTimer) streaming(idle time.Duration) {
	ut.idle.Store(true)
	ut.t.Reset(orNever(idle))
}

func orNever(d time.Duration) time.Duration {
	if d <= 0 {
		return math.MaxInt64
	}
	return d
}

// forward sends the request to one worker and relays the answer. It returns
// an *upstreamError when the attempt failed before anything was written to
// the client (a connect error, no response head in time, a 5xx while a
// retry is allowed, a stream that broke before its first token); any other
// failure has already been answered or reported to the client.
func (g *Gateway) forward(c *call, wk *scoring.Worker, mayRetry bool) (err error) {
	ctx, w, r, rec, x := c.ctx, c.w, c.r, c.rec, c.x
	span := SpanUpstream
	if x.remotePrefill() {
		span = SpanDecode
	}
	ctx, sp := g.tr.attempt(ctx, span, wk)
	defer func() { endSpan(sp, err) }()
	tokens := x.req.EstimatedTokens
	wk.Live.Enter(tokens)
	defer wk.Live.Leave(tokens)
	ws := g.series(wk)
	rec.ws = ws
	ws.InFlight.Inc()
	defer ws.InFlight.Dec()

	// The ttft term's prefill queue: this request's uncached prompt tokens
	// until its first token (which teaches the worker's prefill rate) or its end.
	var pre *scoring.Prefill
	if n, ok := x.req.UncachedTokens(wk); ok && !x.remotePrefill() {
		pre = g.beginPrefill(x.req.Model, wk, n)
	}
	defer pre.Cancel()

	release, err := g.useAdapter(ctx, x, wk) // a LoRA adapter loaded on demand (adapters.go)
	if err != nil {
		return err
	}
	defer func() { release(rec.status) }()
	uctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	up, rt, err := g.upstreamRequest(uctx, r, x, wk)
	if err != nil {
		return err // not an upstreamError: answered 500 by the caller
	}
	to := x.pol.Timeouts
	timer := newUpstreamTimer(cancel, to.ResponseHeader)
	defer timer.t.Stop()
	sent := time.Now()
	resp, err := rt.RoundTrip(up)
	if err != nil || resp.StatusCode >= 400 {
		g.refused(ctx, x, wk)
	}
	if err != nil {
		if errors.Is(context.Cause(uctx), errResponseHeaderTimeout) {
			g.m.UpstreamTimeouts.WithLabelValues(x.req.Model, "response_header").Inc()
			return &upstreamError{err: errResponseHeaderTimeout, timeout: true}
		}
		if isConnectError(err) {
			if x.remote == nil { // another datacenter's router: the federation's own failure budget
				g.connectFailed(wk, x.reqID)
			}
			return &upstreamError{err: err, unreachable: true}
		}
		return &upstreamError{err: err}
	}
	if x.remote == nil {
		g.connected(wk)
	}
	defer resp.Body.Close()
	timer.streaming(to.StreamIdle)
	if resp.StatusCode >= 500 && mayRetry {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return &upstreamError{err: errors.New("engine answered " + resp.Status), loop: resp.StatusCode == http.StatusLoopDetected}
	}
	if resp.StatusCode >= 400 {
		g.engineError(c, resp)
		return nil
	}
	if resp.StatusCode/100 == 2 && x.remote == nil && g.cfg.OnAccept != nil {
		g.cfg.OnAccept(ctx, x.pol.Scoring, x.req, wk)
	}

	if _, leg := w.(*cascade.Buffer); !leg && gzipFor(r, x.fields.Stream, resp) {
		gw := newGzipWriter(w)
		defer gw.close()
		w = gw
	}
	rl := &relay{g: g, w: w, rec: rec, x: x, wk: wk, resp: resp, pre: pre, sent: sent, timer: timer,
		stream: x.fields.Stream, sse: x.fields.Stream && resp.StatusCode == http.StatusOK && isEventStream(resp.Header)}
	rl.usage.sse = rl.sse
	rl.strip = rl.sse && asksUsage(x)
	if _, leg := w.(*cascade.Buffer); rl.sse && !leg && migratable(x, wk) {
		rl.mig = newStreamTrack(x, wk)
	}
	if fl, ok := w.(http.Flusher); ok {
		rl.fl = fl
	}
	bp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bp)
	rl.buf = *bp
	if rl.sse {
		if hold := g.holdFor(x); hold > 0 {
			if err := rl.hold(hold); err != nil {
				return g.beforeFirstByte(x, uctx, err)
			}
		}
	}
	err = rl.run(ctx, uctx, r)
	var ms *migrateSignal
	if !errors.As(err, &ms) {
		return err
	}
	// This leg is over: its span ends with the engine's failure, and the
	// stream goes on on another engine.
	timer.t.Stop()
	endSpan(sp, ms)
	sp = noSpan()
	return g.migrate(c, rl, ms)
}

// isConnectError reports whether err is the failure to set up a connection:
// a dial's, a TLS handshake's (tlsDialer's HandshakeError), or a TLS alert
// from the engine's side. With TLS 1.3 the client's handshake ends before
// the server has checked the client's certificate, so a sidecar refusing
// the router shows as an alert on the first read, the request unprocessed.
func isConnectError(err error) bool {
	var op *net.OpError
	var hs *HandshakeError
	return errors.As(err, &hs) || (errors.As(err, &op) && (op.Op == "dial" || op.Op == "remote error"))
}

// beforeFirstByte turns a response that failed before anything reached the
// client into the attempt's error.
func (g *Gateway) beforeFirstByte(x *exchange, uctx context.Context, err error) error {
	if errors.Is(context.Cause(uctx), errStreamIdle) {
		g.m.UpstreamTimeouts.WithLabelValues(x.req.Model, "stream_idle").Inc()
		return &upstreamError{err: errStreamIdle, timeout: true}
	}
	if uctx.Err() != nil {
		return uctx.Err() // the client left or the deadline passed
	}
	return &upstreamError{err: err}
}

// upstreamRequest builds the request to wk: the client's body and its
// end-to-end headers but its Authorization and X-Oasis-* (towardEngine),
// X-Request-Id, this router's Via entry (hop.go), and a hosted API's key.
func (g *Gateway) upstreamRequest(ctx context.Context, r *http.Request, x *exchange, wk *scoring.Worker) (*http.Request, http.RoundTripper, error) {
	target, rt := "http://"+wk.Address+r.URL.RequestURI(), g.cfg.Transport
	if x.remote != nil {
		rt = g.cfg.Federation.Transport()
	} else if wk.Upstream != "" {
		// A hosted API: its base URL already ends in /v1, like the request path starts.
		target = strings.TrimSuffix(wk.Upstream, "/") + strings.TrimPrefix(r.URL.RequestURI(), "/v1")
		rt = g.cfg.HostedTransport
	}
	body, err := g.attemptBody(x, wk) // never reassigned: the closure below captures it by value
	if err != nil {
		return nil, nil, err
	}
	up, err := http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	// Lets the transport resend the body on a pooled connection the engine
	// had closed before reading anything.
	up.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	up.Header = towardEngine(r.Header, len(r.Header)+2)
	delete(up.Header, "Expect") // the body is already here; never wait for 100 Continue
	// Identity: the router reads usage (and a cascade's small answer) from
	// the answer, and compresses toward the client itself (compress.go).
	up.Header["Accept-Encoding"] = identityEncoding
	// A pooled connection can also be closed by the engine (its keep-alive
	// timeout: 5 s in uvicorn and cpp-httplib) just as the request is written
	// on it; the write succeeds and the read fails. net/http resends such a
	// request on a new connection only if it is idempotent, which a nil
	// Idempotency-Key declares without sending the header. A request that
	// failed before its first byte is retried on another worker anyway, so
	// the gateway treats every request it forwards as safe to resend.
	if _, ok := up.Header["Idempotency-Key"]; !ok {
		up.Header["Idempotency-Key"] = nil
	}
	switch auth := r.Header["Authorization"]; {
	case wk.UpstreamKey != "":
		up.Header.Set("Authorization", "Bearer "+wk.UpstreamKey)
	case wk.Upstream != "" && g.cfg.Auth == nil && len(auth) > 0:
		// A hosted API the operator allow-listed without a key of the
		// router's: the client brings its own. Engines never see a
		// client's key.
		up.Header["Authorization"] = auth
	}
	up.Header.Set("X-Request-Id", x.reqID)
	g.markHop(up, r)
	g.tr.inject(ctx, up.Header)
	if x.remote != nil {
		g.remoteRequest(ctx, up, x.remote)
	}
	return up, rt, nil
}

// series returns wk's metric series, kept on the worker's Live (which
// outlives pool updates) instead of being looked up by label values on
// every request.
func (g *Gateway) series(wk *scoring.Worker) *metrics.WorkerSeries {
	if wk.Live == nil {
		return g.m.Worker(wk.Model, wk.ID)
	}
	if c, ok := wk.Live.Attached().(*workerSeries); ok && c.m == g.m && c.model == wk.Model && c.id == wk.ID {
		return c.ws
	}
	c := &workerSeries{m: g.m, model: wk.Model, id: wk.ID, ws: g.m.Worker(wk.Model, wk.ID)}
	wk.Live.Attach(c)
	return c.ws
}

// workerSeries are a worker's metric series, kept on its scoring.Live.
type workerSeries struct {
	m         *metrics.Metrics // whose series they are
	model, id string
	ws        *metrics.WorkerSeries
}

func isEventStream(h http.Header) bool {
	mt, _, err := mime.ParseMediaType(h.Get("Content-Type"))
	return err == nil && mt == "text/event-stream"
}

// refused tells OnRefuse that wk did not take x's request (a local engine
// only: another datacenter's router is not in this router's cache state).
func (g *Gateway) refused(ctx context.Context, x *exchange, wk *scoring.Worker) {
	if x.remote == nil && g.cfg.OnRefuse != nil {
		g.cfg.OnRefuse(ctx, x.pol.Scoring, x.req, wk)
	}
}
