package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// proxy serves POST /v1/{chat/completions,completions,embeddings}.
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request) {
	rec := &outcome{g: g, start: time.Now(), status: http.StatusOK}
	defer rec.done()
	ctx, tr := g.tr.startRequest(r.Context(), r)
	rec.tr = tr
	if g.refuseLoop(w, r, rec) {
		return
	}

	body, ok := g.readBody(w, r, rec)
	if !ok {
		return
	}
	f, err := openai.ParseRequest(r.URL.Path, body)
	if err != nil {
		param := ""
		if fe := (*openai.FieldError)(nil); errors.As(err, &fe) && fe.Field == "model" {
			param = "model"
		}
		rec.fail(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", param, err.Error(), 0)
		return
	}
	if f.RouterOwned {
		// The router's disaggregation protocol is not the client's to speak
		// (openai.RouterOwned): removed before any path sees the body.
		if body, err = openai.WithoutRouterOwned(body); err == nil {
			f, err = openai.ParseRequest(r.URL.Path, body)
		}
		if err != nil {
			rec.fail(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "", err.Error(), 0)
			return
		}
	}
	rec.model = f.Model

	if v := r.Header.Get(DeadlineHeader); v != "" {
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

	doc := g.cfg.Policy.Current()
	pol := doc.For(f.Model)
	req := &scoring.Request{Model: f.Model, Path: r.URL.Path, Body: body, Stream: f.Stream, Prompt: f.Prompt,
		EstimatedTokens: estimateTokens(len(body), f)}
	reqID := r.Header.Get("X-Request-Id")
	if reqID == "" {
		reqID = g.ids.next()
	}
	x := &exchange{req: req, fields: f, body: body, reqID: reqID, pol: pol}
	tr.identify(f.Model, reqID)
	if g.federating(ctx) {
		g.cfg.Federation.Arrived()
	}
	if c, ok := doc.CascadeFor(f.Model); ok {
		g.cascade(ctx, w, r, rec, x, &c)
		return
	}
	g.serve(ctx, w, r, rec, x)
}

// serve admits x for its model and sends it to a worker of that model (or
// of its overflow pool, or another datacenter), answering the client.
func (g *Gateway) serve(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, x *exchange) {
	if len(g.candidates(x.req.Model)) == 0 {
		if !g.federateEarly(ctx, w, r, rec, x, false) && !g.overflow(ctx, w, r, rec, x, reasonNoWorker) {
			g.noWorker(w, rec, x.req.Model)
		}
		return
	}
	if g.federateEarly(ctx, w, r, rec, x, true) || g.overflowEarly(ctx, w, r, rec, x) {
		return
	}
	slot, ok := g.admit(ctx, w, r, rec, x)
	if !ok {
		return
	}
	var once sync.Once
	x.release = func() { once.Do(slot.Release) }
	defer x.release()

	if g.cfg.Prepare != nil {
		g.cfg.Prepare(x.req)
	}
	rec.tr.wrapTokenize(x.req)
	if g.disaggregate(ctx, w, r, rec, x) {
		return
	}
	g.attempt(ctx, w, r, rec, x)
}

// exchange is what every attempt at one request shares.
type exchange struct {
	req    *scoring.Request
	fields openai.Request
	body   []byte
	reqID  string
	pol    policy.Resolved

	release func()             // gives the admission slot back (idempotent)
	remote  *federation.Target // set while the attempt goes to another datacenter
}

// remotePrefill reports whether x is a decode leg (leg): its body is not
// the client's, and its prompt is computed by a prefill worker, so the
// decode worker has no prefill of its own to account for. (Told by the
// body rather than a field: the exchange stays in a 256-byte allocation.)
func (x *exchange) remotePrefill() bool {
	return len(x.body) > 0 && len(x.req.Body) > 0 && &x.body[0] != &x.req.Body[0]
}

// attempt sends the request to a worker and, when that fails before anything
// reached the client, once more to another.
func (g *Gateway) attempt(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, x *exchange) {
	var tried []*scoring.Worker
	var last *upstreamError
	for n := 0; n < 2; n++ {
		cands := slices.DeleteFunc(slices.Clone(g.candidates(x.req.Model)), func(w *scoring.Worker) bool {
			return slices.ContainsFunc(tried, func(t *scoring.Worker) bool { return t.ID == w.ID })
		})
		if len(cands) == 0 {
			switch {
			case last == nil:
				g.noWorker(w, rec, x.req.Model)
			case !g.federateFailed(ctx, w, r, rec, x):
				upstreamFailed(w, rec, last, "; no other worker is available")
			}
			return
		}
		t0 := time.Now()
		dctx, dsp := rec.tr.start(ctx, SpanRoute)
		d, err := g.cfg.Selector.Pick(dctx, x.pol.Scoring, x.req, cands)
		g.m.RoutingDecision.Observe(time.Since(t0).Seconds())
		if err == nil {
			rec.tr.decided(dctx, dsp, g.cfg.Selector, x, cands, d.Worker)
		}
		endSpan(dsp, err)
		if err != nil {
			g.log.Error("choosing worker failed", "model", x.req.Model, "error", err)
			rec.fail(w, http.StatusInternalServerError, "server_error", "routing_failed", "", "choosing a worker failed", 0)
			return
		}
		wk := d.Worker
		tried = append(tried, wk)
		if g.cfg.OnPick != nil {
			g.cfg.OnPick(ctx, x.pol.Scoring, x.req, wk)
		}
		if n == 0 && g.federateChosen(ctx, w, r, rec, x, wk) {
			return
		}
		rec.worker = wk.ID
		err = g.forward(ctx, w, r, rec, x, wk, n == 0)
		switch {
		case err == nil:
			return
		case ctx.Err() != nil:
			g.contextFailed(w, r, rec, "deadline expired before the engine answered")
			return
		case !errors.As(err, &last):
			rec.fail(w, http.StatusInternalServerError, "server_error", "internal_error", "", "building the upstream request failed", 0)
			return
		case n == 0:
			g.m.Retries.WithLabelValues(x.req.Model).Inc()
			rec.tr.retried()
			g.log.Warn("engine failed before the first token; retrying on another worker",
				"model", x.req.Model, "worker", wk.ID, "request_id", x.reqID, "error", err)
		case !g.federateFailed(ctx, w, r, rec, x):
			upstreamFailed(w, rec, last, "")
		}
	}
}

// upstreamFailed answers a request whose last attempt failed before its
// first byte: 504 when the engine was silent too long, 503 when no
// connection to it could be made, 508 when it was a router the request had
// passed (hop.go), else 502.
func upstreamFailed(w http.ResponseWriter, rec *outcome, e *upstreamError, why string) {
	if e.loop {
		rec.fail(w, http.StatusLoopDetected, "server_error", "loop_detected", "",
			"routing loop: the engine chosen is a router this request had already passed through "+
				"(an engine registration points at a router): "+e.Error()+why, 0)
		return
	}
	if e.unreachable {
		rec.fail(w, http.StatusServiceUnavailable, "server_error", "no_reachable_worker", "",
			"no engine could be reached: "+e.Error()+why, time.Second)
		return
	}
	if e.timeout {
		rec.fail(w, http.StatusGatewayTimeout, "server_error", "upstream_timeout", "",
			"the engine did not answer in time: "+e.Error()+why, 0)
		return
	}
	rec.fail(w, http.StatusBadGateway, "server_error", "upstream_unavailable", "",
		"the engine failed before responding: "+e.Error()+why, 0)
}

// readBody reads the request body within the body read timeout, answering
// the client itself when that fails.
func (g *Gateway) readBody(w http.ResponseWriter, r *http.Request, rec *outcome) ([]byte, bool) {
	rc := http.NewResponseController(w)
	// Best effort: a writer without deadlines (tests' recorders) still works.
	_ = rc.SetReadDeadline(time.Now().Add(g.cfg.BodyReadTimeout))
	body, err := readAll(w, r, g.cfg.MaxBodyBytes)
	_ = rc.SetReadDeadline(time.Time{})
	if err == nil {
		return body, true
	}
	var mbe *http.MaxBytesError
	var ne net.Error
	switch {
	case errors.As(err, &mbe):
		rec.fail(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "request_too_large", "",
			"request body exceeds "+strconv.FormatInt(g.cfg.MaxBodyBytes, 10)+" bytes", 0)
	case errors.As(err, &ne) && ne.Timeout():
		w.Header().Set("Connection", "close")
		rec.fail(w, http.StatusRequestTimeout, "invalid_request_error", "request_timeout", "",
			"the request body did not arrive within "+g.cfg.BodyReadTimeout.String(), 0)
	case r.Context().Err() != nil || errors.Is(err, io.ErrUnexpectedEOF):
		rec.status = 499 // the client went away mid-body; nothing to answer
	default:
		// A body the server could not decode: malformed chunked framing.
		w.Header().Set("Connection", "close")
		rec.fail(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "",
			"malformed request body: "+err.Error(), 0)
	}
	return nil, false
}

// readAll reads the request body, at most max bytes. A body of known length
// is read into a buffer of exactly that size.
func readAll(w http.ResponseWriter, r *http.Request, max int64) ([]byte, error) {
	if n := r.ContentLength; n >= 0 && n <= max {
		// The server stops the body at its declared length.
		b := make([]byte, n)
		if _, err := io.ReadFull(r.Body, b); err != nil {
			return nil, err
		}
		return b, nil
	}
	return io.ReadAll(http.MaxBytesReader(w, r.Body, max))
}

// admit waits for an admission slot, answering the client (or sending the
// request to the model's overflow pool) when none comes.
func (g *Gateway) admit(ctx context.Context, w http.ResponseWriter, r *http.Request, rec *outcome, x *exchange) (admission.Slot, bool) {
	model := x.req.Model
	actx, sp := rec.tr.admission(ctx)
	slot, err := g.cfg.Admission.AcquireSlot(actx, model, x.pol.Limits)
	rec.tr.queued(sp, err)
	switch {
	case err == nil:
		return slot, true
	case errors.Is(err, admission.ErrQueueFull) && g.overflow(ctx, w, r, rec, x, reasonQueueFull),
		errors.Is(err, admission.ErrQueueTimeout) && g.overflow(ctx, w, r, rec, x, reasonQueueTimeout):
		// The overflow pool answered.
	case errors.Is(err, admission.ErrQueueFull):
		g.m.AdmissionRefused.WithLabelValues(model, "queue_full").Inc()
		rec.fail(w, http.StatusTooManyRequests, "requests", "model_overloaded", "",
			"too many requests queued for model "+strconv.Quote(model), time.Second)
	case errors.Is(err, admission.ErrQueueTimeout):
		g.m.AdmissionRefused.WithLabelValues(model, "queue_timeout").Inc()
		rec.fail(w, http.StatusServiceUnavailable, "server_error", "queue_timeout", "",
			"timed out waiting for capacity for model "+strconv.Quote(model), time.Second)
	default:
		g.contextFailed(w, r, rec, "deadline expired while queued")
	}
	return admission.Slot{}, false
}

// candidates are the workers a request may go to directly (directWorker):
// prefill instances, and SGLang decode instances, which wait for a prefill
// peer, are left out when others exist; so are hosted workers (oasis_upstream)
// unless the policy makes them peers (hosted_peers): they are the overflow.
func (g *Gateway) candidates(model string) []*scoring.Worker {
	ws := routable(g.cfg.Pool.Workers(model), time.Now())
	for _, w := range ws {
		if w.Upstream != "" {
			return directOnly(g.localFirst(model, ws))
		}
	}
	return directOnly(ws)
}

func directOnly(ws []*scoring.Worker) []*scoring.Worker {
	for _, w := range ws {
		if !directWorker(w) {
			if d := slices.DeleteFunc(slices.Clone(ws), func(w *scoring.Worker) bool { return !directWorker(w) }); len(d) > 0 {
				return d
			}
			return ws
		}
	}
	return ws
}

func (g *Gateway) noWorker(w http.ResponseWriter, rec *outcome, model string) {
	_, inPolicy := g.cfg.Policy.Current().Models[model]
	switch {
	case !g.cfg.Pool.Synced():
		// Discovery has not answered yet (Consul unreachable at start-up):
		// the model may well exist.
		rec.fail(w, http.StatusServiceUnavailable, "server_error", "no_healthy_worker", "",
			"engine discovery has not completed yet; no engine is known", time.Second)
	case g.cfg.Pool.Known(model) || inPolicy:
		rec.fail(w, http.StatusServiceUnavailable, "server_error", "no_healthy_worker", "",
			"no healthy engine is serving model "+strconv.Quote(model), time.Second)
	default:
		rec.fail(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			"The model "+strconv.Quote(model)+" does not exist or no engine serves it", 0)
	}
}

func (g *Gateway) contextFailed(w http.ResponseWriter, r *http.Request, rec *outcome, msg string) {
	if r.Context().Err() != nil {
		rec.status = 499 // client went away; nothing to send
		return
	}
	g.m.AdmissionRefused.WithLabelValues(rec.model, "deadline").Inc()
	rec.fail(w, http.StatusGatewayTimeout, "server_error", "deadline_exceeded", "", msg, 0)
}

// estimateTokens approximates prompt (≈4 bytes per token) plus output tokens.
func estimateTokens(bodyLen int, f openai.Request) int64 {
	out := 256
	if f.HasMaxTokens {
		out = f.MaxTokens
	}
	return int64(bodyLen/4 + out)
}

// requestIDs generates X-Request-Id values: a random per-process prefix and a
// counter. IDs only need to be unique; a counter needs no system call.
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

// outcome records one request's metrics exactly once.
type outcome struct {
	g        *Gateway
	start    time.Time
	model    string
	worker   string
	status   int
	ws       *metrics.WorkerSeries // the chosen worker's series, once forwarded
	ttftDone bool
	recorded bool
	tr       *reqTrace // nil: tracing off
}

// firstByte records the time to the first byte, now.
func (o *outcome) firstByte(now time.Time) {
	if !o.ttftDone {
		o.ttftDone = true
		ttft := now.Sub(o.start)
		o.g.m.Model(o.model).TTFT.Observe(ttft.Seconds())
		o.tr.firstByte(ttft)
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
	defer o.tr.end(o)
	model := o.model
	if model == "" {
		model = "_unparsed"
	} else if o.ws == nil && !o.g.cfg.Pool.Known(model) {
		// (A forwarded request's model had workers, so it is known: the
		// pool's known models only grow.)
		model = "_unknown" // bound label cardinality: clients choose model strings
	}
	if o.ws != nil && model == o.model {
		o.ws.Requests(o.status).Inc()
	} else {
		o.g.m.Requests.WithLabelValues(model, strconv.Itoa(o.status), o.worker).Inc()
	}
	d := time.Since(o.start)
	o.g.m.Model(model).Duration.Observe(d.Seconds())
	if o.status < 400 && o.ws != nil && !strings.HasPrefix(o.worker, "dc:") {
		o.g.service.observe(o.model, d)
	}
}
