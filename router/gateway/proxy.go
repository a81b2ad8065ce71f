package gateway

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// proxy serves POST /v1/{chat/completions,completions,embeddings}.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	ps := &proxyState{} // one allocation for the request's bookkeeping
	rec := &ps.rec
	*rec = outcome{g: g, start: start, status: http.StatusOK}
	defer rec.done()

	body, err := readBody(w, r, g.opts.MaxBodyBytes)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			rec.fail(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
				"request body exceeds "+strconv.FormatInt(g.opts.MaxBodyBytes, 10)+" bytes", 0)
			return
		}
		rec.status = 499
		return
	}
	f, err := openai.ParseRequest(r.URL.Path, body)
	if err != nil {
		param := ""
		var fe *openai.FieldError
		if errors.As(err, &fe) && fe.Field == "model" {
			param = "model"
		}
		rec.fail(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", param, err.Error(), 0)
		return
	}
	rec.model = f.Model

	ctx := r.Context()
	if v := firstValue(r.Header, DeadlineHeader); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms <= 0 {
			rec.fail(w, http.StatusBadRequest, "invalid_request_error", "invalid_deadline", "",
				DeadlineHeader+" must be a positive number of milliseconds", 0)
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, time.Duration(ms)*time.Millisecond)
		defer cancel()
	}

	first := g.candidates(f.Model)
	if len(first) == 0 {
		g.noWorker(w, rec, f.Model)
		return
	}
	pol := g.opts.Policy.Current().For(f.Model)

	slot, err := g.opts.Admission.AcquireSlot(ctx, f.Model, pol.Limits)
	if err != nil {
		switch {
		case errors.Is(err, admission.ErrQueueFull):
			g.m.AdmissionRefused.WithLabelValues(f.Model, "queue_full").Inc()
			rec.fail(w, http.StatusTooManyRequests, "requests", "model_overloaded", "",
				"too many requests queued for model "+strconv.Quote(f.Model), time.Second)
		case errors.Is(err, admission.ErrQueueTimeout):
			g.m.AdmissionRefused.WithLabelValues(f.Model, "queue_timeout").Inc()
			rec.fail(w, http.StatusServiceUnavailable, "server_error", "queue_timeout", "",
				"timed out waiting for capacity for model "+strconv.Quote(f.Model), time.Second)
		default:
			g.contextFailed(w, r, rec, "deadline expired while queued")
		}
		return
	}
	defer slot.Release()

	req := &ps.req
	*req = scoring.Request{Model: f.Model, Path: r.URL.Path, Body: body, Stream: f.Stream, Prompt: f.Prompt,
		EstimatedTokens: estimateTokens(len(body), f)}
	if g.opts.Prepare != nil {
		g.opts.Prepare(req)
	}

	reqID := firstValue(r.Header, "X-Request-Id")
	if reqID == "" {
		reqID = g.ids.next()
	}
	tried := ps.tried[:0]
	for attempt := 0; attempt < 2; attempt++ {
		cands := first
		if len(tried) > 0 {
			cands = g.candidates(f.Model)
			cands = slices.DeleteFunc(slices.Clone(cands), func(w *scoring.Worker) bool { return slices.Contains(tried, w) || sameID(tried, w) })
		}
		if len(cands) == 0 {
			if attempt == 0 {
				g.noWorker(w, rec, f.Model)
			} else {
				rec.fail(w, http.StatusBadGateway, "server_error", "upstream_unavailable", "",
					"the engine failed before responding and no other worker is available", 0)
			}
			return
		}
		t0 := rec.now()
		d, err := g.opts.Selector.Pick(ctx, pol.Scoring, req, cands)
		// The end of the decision is also when the request counts as sent
		// (prefill timing, the connection pool's idle age): one clock read.
		picked := rec.now()
		g.m.RoutingDecision.Observe(picked.Sub(t0).Seconds())
		if err != nil {
			g.log.Error("choosing worker failed", "model", f.Model, "error", err)
			rec.fail(w, http.StatusInternalServerError, "server_error", "routing_failed", "", "choosing a worker failed", 0)
			return
		}
		wk := d.Worker
		tried = append(tried, wk)
		if g.opts.OnPick != nil {
			g.opts.OnPick(ctx, pol.Scoring, req, wk)
		}
		rec.worker = wk.ID
		// The worker's prefill queue, as the ttft term models it: this
		// request's uncached prompt tokens until its first token (which
		// teaches the worker's prefill rate) or its end.
		var pre *scoring.Prefill
		if n, ok := req.UncachedTokens(wk); ok {
			pre = wk.Live.StartPrefill(n)
		}
		if attempt > 0 {
			ps.fw = forwarding{} // the first attempt's, done with
		}
		retryable, err := g.forward(ctx, w, r, rec, &ps.fw, wk, body, reqID, attempt == 0, f, pre, picked)
		pre.Cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			g.contextFailed(w, r, rec, "deadline expired before the engine answered")
			return
		}
		if !retryable {
			if !rec.ttftDone {
				rec.fail(w, http.StatusInternalServerError, "server_error", "internal_error", "", "building the upstream request failed", 0)
			}
			return
		}
		if attempt == 0 {
			g.m.Retries.WithLabelValues(f.Model).Inc()
			g.log.Warn("engine failed before the first byte; retrying on another worker",
				"model", f.Model, "worker", wk.ID, "request_id", reqID, "error", err)
			continue
		}
		rec.fail(w, http.StatusBadGateway, "server_error", "upstream_unavailable", "",
			"the engine failed before responding: "+err.Error(), 0)
	}
}

func sameID(tried []*scoring.Worker, w *scoring.Worker) bool {
	for _, t := range tried {
		if t.ID == w.ID {
			return true
		}
	}
	return false
}

// candidates are the workers a request may go to directly: prefill-only
// instances are left out when others exist.
func (g *Gateway) candidates(model string) []*scoring.Worker {
	ws := g.opts.Pool.Workers(model)
	for _, w := range ws {
		if w.Role == "prefill" {
			return slices.DeleteFunc(slices.Clone(ws), func(w *scoring.Worker) bool { return w.Role == "prefill" })
		}
	}
	return ws
}

func (g *Gateway) noWorker(w http.ResponseWriter, rec *outcome, model string) {
	_, inPolicy := g.opts.Policy.Current().Models[model]
	if g.opts.Pool.Known(model) || inPolicy {
		rec.fail(w, http.StatusServiceUnavailable, "server_error", "no_healthy_worker", "",
			"no healthy engine is serving model "+strconv.Quote(model), time.Second)
		return
	}
	rec.fail(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
		"The model "+strconv.Quote(model)+" does not exist or no engine serves it", 0)
}

func (g *Gateway) contextFailed(w http.ResponseWriter, r *http.Request, rec *outcome, msg string) {
	if r.Context().Err() != nil {
		rec.status = 499 // client went away; nothing to send
		return
	}
	g.m.AdmissionRefused.WithLabelValues(rec.model, "deadline").Inc()
	rec.fail(w, http.StatusGatewayTimeout, "server_error", "deadline_exceeded", "", msg, 0)
}

// forward sends the request to one worker and copies the response back. It
// returns retryable=true with an error when nothing was written to the client
// and the failure was a connect error or a 5xx: the caller may try another
// worker. A 5xx on the last attempt is passed to the client as the engine sent it.
func (g *Gateway) forward(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, st *forwarding,
	wk *scoring.Worker, body []byte, reqID string, mayRetry bool, f openai.Request, pre *scoring.Prefill, sent time.Time) (retryable bool, err error) {
	tokens := estimateTokens(len(body), f)
	wk.Live.Enter(tokens)
	defer wk.Live.Leave(tokens)
	ws, ms := g.series(wk)
	rec.ws = ws
	if wk.Model == rec.model {
		rec.ms = ms
	}
	ws.InFlight.Inc()
	defer ws.InFlight.Dec()

	// The client's header goes upstream as it is when nothing in it needs
	// removing (the usual case): only X-Request-Id is set in it, which the
	// client's request carries on no further. Otherwise a copy is edited.
	hdr := r.Header
	if !g.forwardAsIs(r.Header, wk) {
		hdr = make(http.Header, len(r.Header)+2)
		for k, vs := range r.Header {
			if !isHopHeader(k) {
				hdr[k] = vs // shared, never modified: entries are replaced, not changed
			}
		}
	}
	// The upstream request's parts and the relay's state live in the
	// request's proxyState (zero here: the caller clears it before a retry),
	// no allocation of their own. Their fields are set one by one: a
	// composite literal is built aside and copied, hundreds of bytes.
	var up *http.Request
	if wk.Upstream == "" {
		// Built from the parsed client URL: no URL string to parse again.
		u := &st.u
		u.Scheme, u.Host, u.Path, u.RawPath, u.RawQuery = "http", wk.Address, r.URL.Path, r.URL.RawPath, r.URL.RawQuery
		st.body.Reset(body)
		// No GetBody: the transport rewinds the body (a Seeker) to resend it.
		up = &st.up // its context is passed to the transport apart (roundTrip)
		up.Method, up.URL, up.Header, up.Host, up.Body = http.MethodPost, u, hdr, wk.Address, &st.body
		up.Proto, up.ProtoMajor, up.ProtoMinor = "HTTP/1.1", 1, 1
	} else {
		// A hosted API: its base URL already ends in /v1, like the request path starts.
		target := strings.TrimSuffix(wk.Upstream, "/") + strings.TrimPrefix(r.URL.RequestURI(), "/v1")
		if up, err = http.NewRequestWithContext(ctx, http.MethodPost, target, bytes.NewReader(body)); err != nil {
			return false, err
		}
		up.Header = hdr
	}
	rt := g.upstream
	if wk.Upstream != "" {
		rt = g.hosted
	}
	// Canonical keys, set directly: Header.Set and Del canonicalise each time.
	delete(up.Header, "Expect") // the body is already here; never wait for 100 Continue
	switch {
	case wk.UpstreamKey != "":
		up.Header["Authorization"] = []string{"Bearer " + wk.UpstreamKey}
	case g.opts.Auth != nil:
		delete(up.Header, "Authorization") // the router's key is not the engine's
	}
	st.reqID[0] = reqID
	up.Header["X-Request-Id"] = st.reqID[:]
	up.ContentLength = int64(len(body))

	var resp *http.Response
	switch t, ok := rt.(*Transport); {
	case ok && up == &st.up:
		resp, err = t.roundTrip(ctx, up, sent, &st.x)
	case up == &st.up:
		resp, err = rt.RoundTrip(up.WithContext(ctx))
	default:
		resp, err = rt.RoundTrip(up)
	}
	if err != nil {
		return true, err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 500 && mayRetry {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
		return true, errors.New("engine answered " + resp.Status)
	}

	reqIDs := st.reqID[:] // one element, never modified: shared
	if hs, ok := w.(headerSetter); ok && resp.Header != nil {
		// The engine's response header is the router's own: edited in
		// place and handed to the server instead of copied. The
		// transport's head parser says when there is nothing to remove.
		if !hopFree(resp) {
			for k := range resp.Header {
				if isHopHeader(k) {
					delete(resp.Header, k)
				}
			}
		}
		resp.Header["X-Request-Id"] = reqIDs
		if !hs.SetHeader(resp.Header) {
			copyHeaders(w.Header(), resp.Header)
		}
	} else {
		copyResponseHeader(w.Header(), resp.Header, reqIDs)
	}
	rec.status = resp.StatusCode
	w.WriteHeader(resp.StatusCode)
	// Headers go out with the first body bytes (one write, not two); an
	// empty body is flushed at the end by the server.

	bp := g.bufs.Get().(*[]byte)
	defer g.bufs.Put(bp)
	buf := *bp
	rl := &st.relay
	rl.w, rl.usage.sse, rl.rec, rl.pre, rl.sent = w, f.Stream, rec, pre, sent
	rl.timeFirst = f.Stream && resp.StatusCode == http.StatusOK
	if fl, ok := w.(http.Flusher); ok {
		rl.fl = fl
	} else {
		rl.fl = controllerFlusher{http.NewResponseController(w)}
	}
	var rerr error
	if sb, ok := resp.Body.(streamer); ok {
		// The engine's chunks are decoded where they were read and waits
		// between events skip the read that only sees EAGAIN.
		rerr = sb.stream(buf, rl)
	} else {
		rerr = errStreamUnsupported
	}
	if rerr == errStreamUnsupported {
		rerr = nil
		for !rl.clientGone && rerr == nil {
			var n int
			n, rerr = resp.Body.Read(buf)
			if n > 0 {
				_ = rl.emit(buf[:n], rerr != nil)
			}
		}
		if rerr == io.EOF {
			rerr = nil
		}
	}
	clientGone := rl.clientGone
	usage := &rl.usage
	if clientGone {
		rec.status = 499
		return false, nil // client gone; ctx cancels the upstream
	}
	if rerr != nil {
		if r.Context().Err() != nil {
			rec.status = 499
			return false, nil
		}
		// Bytes were sent: never retry. Abort so the client sees a broken
		// response rather than a silently truncated one.
		if ctx.Err() != nil {
			g.log.Debug("deadline passed mid-stream; cutting the response", "worker", wk.ID, "request_id", reqID)
			rec.status = http.StatusGatewayTimeout
		} else {
			g.log.Warn("engine stream broke after the first byte", "worker", wk.ID, "request_id", reqID, "error", rerr)
			rec.status = http.StatusBadGateway
		}
		rec.done()
		panic(http.ErrAbortHandler)
	}
	if p, c, ok := usage.result(); ok {
		ws.PromptTokens.Add(float64(p))
		ws.CompletionTokens.Add(float64(c))
		wk.Live.AddGenerated(int64(c))
	}
	return false, nil
}

// workerSeries are a worker's metric series, kept on its scoring.Live
// (series).
type workerSeries struct {
	m         *metrics.Metrics // whose series they are
	model, id string
	ws        *metrics.WorkerSeries
	ms        *metrics.ModelSeries // of model
}

// series returns wk's metric series and its model's. They are kept on the
// worker's Live, which outlives pool updates, instead of being looked up
// by label values on every request.
func (g *Gateway) series(wk *scoring.Worker) (*metrics.WorkerSeries, *metrics.ModelSeries) {
	if wk.Live == nil {
		return g.m.Worker(wk.Model, wk.ID), g.m.Model(wk.Model)
	}
	if c, ok := wk.Live.Attached().(*workerSeries); ok && c.m == g.m && c.model == wk.Model && c.id == wk.ID {
		return c.ws, c.ms
	}
	c := &workerSeries{m: g.m, model: wk.Model, id: wk.ID, ws: g.m.Worker(wk.Model, wk.ID), ms: g.m.Model(wk.Model)}
	wk.Live.Attach(c)
	return c.ws, c.ms
}

// streamer is the engine transport's body, which relays chunked bodies
// itself (body.stream).
type streamer interface {
	stream(buf []byte, em emitter) error
}

// forwarding is one forward's upstream request parts and relay state.
type forwarding struct {
	u     url.URL
	body  reqBody
	up    http.Request
	reqID [1]string // the upstream X-Request-Id value, also the response's
	relay relayer
	x     exchange // the engine's response (Transport); its header goes on to the client's
}

// reqBody is the upstream request's body: the client's bytes, rewindable.
type reqBody struct{ bytes.Reader }

func (*reqBody) Close() error { return nil }

// controllerFlusher flushes writers that only unwrap to a flusher.
type controllerFlusher struct{ rc *http.ResponseController }

func (c controllerFlusher) Flush() { _ = c.rc.Flush() }

// relayer sends the engine's body to the client, one read at a time.
type relayer struct {
	w          http.ResponseWriter
	fl         http.Flusher
	usage      usageScanner
	rec        *outcome
	pre        *scoring.Prefill
	sent       time.Time
	timeFirst  bool // a stream's first event teaches the worker's prefill rate
	clientGone bool
}

// emit sends one read's worth of the engine's body to the client.
func (rl *relayer) emit(data []byte, last bool) error {
	if len(data) == 0 {
		return nil
	}
	rl.usage.feed(data)
	if _, werr := rl.w.Write(data); werr != nil {
		rl.clientGone = true
		return werr
	}
	// One flush per read: engines write one SSE event per chunk, so
	// every event reaches the client as soon as it arrives. When the
	// engine's end of body came with these bytes the server's final
	// write sends them with the terminator, in one syscall.
	if !last {
		rl.fl.Flush()
	}
	if !rl.rec.ttftDone {
		now := rl.rec.now() // one clock read for both first-byte timings
		if rl.timeFirst && rl.pre != nil {
			// A stream's first event carries the first token; a whole
			// response would time the decode too, so only streams teach.
			rl.pre.FirstToken(now.Sub(rl.sent))
		}
		rl.rec.firstByte(now)
	}
	return nil
}

// headerSetter is a ResponseWriter that can take a header map over (h1).
type headerSetter interface{ SetHeader(http.Header) bool }

func copyResponseHeader(h, src http.Header, reqIDs []string) {
	copyHeaders(h, src)
	h["X-Request-Id"] = reqIDs
}

// copyHeaders sets dst's end-to-end headers from src, sharing the value
// slices: src is the engine's response header, read by nobody else.
func copyHeaders(dst, src http.Header) {
	for k, vs := range src {
		if isHopHeader(k) {
			continue
		}
		dst[k] = vs
	}
}

// forwardAsIs reports whether the client's header h needs no header removed
// on its way to wk (see forward).
func (g *Gateway) forwardAsIs(h http.Header, wk *scoring.Worker) bool {
	if wk.UpstreamKey != "" || h == nil {
		return false
	}
	for k := range h {
		if isHopHeader(k) || k == "Expect" || k == "Authorization" && g.opts.Auth != nil {
			return false
		}
	}
	return true
}

// firstValue is h.Get(key) for a canonical key, without canonicalising it
// again.
func firstValue(h http.Header, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// isHopHeader reports whether k (canonical) is a connection-level header a
// proxy must not forward (RFC 9110 §7.6.1).
func isHopHeader(k string) bool {
	switch k {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// estimateTokens approximates prompt (≈4 bytes per token) plus output tokens.
func estimateTokens(bodyLen int, f openai.Request) int64 {
	out := 256
	if f.HasMaxTokens {
		out = f.MaxTokens
	}
	return int64(bodyLen/4 + out)
}

// readBody reads the request body, at most max bytes. A body of known
// length is read into a buffer of exactly that size.
func readBody(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if n := r.ContentLength; n >= 0 && n <= max {
		// The server stops the body at its declared length: no limit
		// reader needed.
		b := make([]byte, n)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
}

// requestIDs generates X-Request-Id values: a random per-process prefix and a
// counter. IDs only need to be unique, and a crypto/rand read per request
// was a getrandom system call on every request.
type requestIDs struct {
	prefix [12]byte // hex of 6 random bytes
	n      atomic.Uint64
}

func newRequestIDs() *requestIDs {
	var r [6]byte
	_, _ = rand.Read(r[:])
	ids := &requestIDs{}
	hex.Encode(ids.prefix[:], r[:])
	return ids
}

func (ids *requestIDs) next() string {
	var b [24]byte
	copy(b[:], ids.prefix[:])
	n := ids.n.Add(1)
	for i := len(b) - 1; i >= len(ids.prefix); i-- {
		b[i] = "0123456789abcdef"[n&0xf]
		n >>= 4
	}
	return string(b[:])
}

// proxyState is what proxy keeps per request.
type proxyState struct {
	rec   outcome
	req   scoring.Request
	tried [2]*scoring.Worker
	fw    forwarding
}

// outcome records one request's metrics exactly once.
type outcome struct {
	g        *Gateway
	start    time.Time
	model    string
	worker   string
	status   int
	ws       *metrics.WorkerSeries // the chosen worker's series, once forwarded
	ms       *metrics.ModelSeries  // o.model's series, once forwarded or the first byte went out
	ttftDone bool
	recorded bool
}

// now is time.Now from the monotonic clock alone, read once where time.Now
// reads the wall clock as well: the request path's timings only subtract.
func (o *outcome) now() time.Time { return o.start.Add(time.Since(o.start)) }

// firstByte records the time to the first byte, now.
func (o *outcome) firstByte(now time.Time) {
	if !o.ttftDone {
		o.ttftDone = true
		if o.ms == nil {
			o.ms = o.g.m.Model(o.model)
		}
		o.ms.TTFT.Observe(now.Sub(o.start).Seconds())
	}
}

func (o *outcome) fail(w http.ResponseWriter, status int, typ, code, param, msg string, retryAfter time.Duration) {
	o.status = status
	writeError(w, status, typ, code, param, msg, retryAfter)
}

func (o *outcome) done() {
	if o.recorded {
		return
	}
	o.recorded = true
	model := o.model
	if model == "" {
		model = "_unparsed"
	} else if o.ws == nil && !o.g.opts.Pool.Known(model) {
		// (A forwarded request's model had workers, so it is known: the
		// pool's known models only grow.)
		model = "_unknown" // bound label cardinality: clients choose model strings
	}
	if o.ws != nil && model == o.model {
		o.ws.Requests(o.status).Inc()
	} else {
		o.g.m.Requests.WithLabelValues(model, strconv.Itoa(o.status), o.worker).Inc()
	}
	ms := o.ms
	if ms == nil || model != o.model {
		ms = o.g.m.Model(model)
	}
	ms.Duration.Observe(time.Since(o.start).Seconds())
}
