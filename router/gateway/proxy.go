package gateway

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// proxy serves the POST endpoints of modelPaths (compat.go).
func (g *Gateway) proxy(w http.ResponseWriter, r *http.Request) {
	rec := &outcome{g: g, start: time.Now(), status: http.StatusOK}
	defer rec.done()
	ctx, tr := g.tr.startRequest(r.Context(), r)
	rec.tr = tr
	if g.refuseLoop(w, r, rec) {
		return
	}

	raw, ok := g.readBody(w, r, rec)
	if !ok {
		return
	}
	f, body, err := g.parse(r, raw)
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
	if k, ok := r.Context().Value(ctxKey{}).(*auth.Key); ok && !k.Allows(f.Model) {
		// OpenAI's answer for a model the key may not use: the same as for one that does not exist.
		rec.fail(w, http.StatusNotFound, "invalid_request_error", "model_not_found", "model",
			"The model "+strconv.Quote(f.Model)+" does not exist or you do not have access to it", 0)
		return
	}

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
	w.Header().Set("X-Request-Id", reqID) // on the router's own refusals too (an SDK's error.requestID)
	x := &exchange{req: req, fields: f, body: body, reqID: reqID, pol: pol}
	tr.identify(f.Model, reqID)
	if g.federating(ctx) {
		g.cfg.Federation.Arrived()
	}
	c := call{ctx: ctx, w: w, r: r, rec: rec, x: x}
	if !g.pinResponse(&c) {
		return
	}
	g.execute(&c, g.route(&c, doc))
}

// singleModel returns the pool's only model when err is a request's
// missing model and the pool (its healthy workers) serves exactly one.
func (g *Gateway) singleModel(err error) (string, bool) {
	var fe *openai.FieldError
	if err == nil || !errors.As(err, &fe) || fe.Field != "model" || !fe.Missing {
		return "", false
	}
	if ms := g.cfg.Pool.Models(); len(ms) == 1 {
		return ms[0], true
	}
	return "", false
}

// exchange is what every attempt at one request shares.
type exchange struct {
	req    *scoring.Request
	fields openai.Request
	body   []byte
	reqID  string
	pol    policy.Resolved

	release func()             // gives the admission slot back (idempotent); nil before admission
	remote  *federation.Target // set while the attempt goes to another datacenter
}

// releaseSlot gives the admission slot back, when the request holds one.
func (x *exchange) releaseSlot() {
	if x.release != nil {
		x.release()
	}
}

// remotePrefill reports whether x is a decode leg (leg): its body is not
// the client's, and its prompt is computed by a prefill worker, so the
// decode worker has no prefill of its own to account for. (Told by the
// body rather than a field: the exchange stays in a 256-byte allocation.)
func (x *exchange) remotePrefill() bool {
	return len(x.body) > 0 && len(x.req.Body) > 0 && &x.body[0] != &x.req.Body[0]
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
