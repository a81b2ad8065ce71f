package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/scoring"
)

// relay copies one engine response to the client.
type relay struct {
	g     *Gateway
	w     http.ResponseWriter
	fl    http.Flusher // nil when the writer cannot flush
	rec   *outcome
	x     *exchange
	wk    *scoring.Worker
	resp  *http.Response
	pre   *scoring.Prefill
	sent  time.Time // when the request went to the engine
	timer *upstreamTimer
	buf   []byte

	stream     bool  // the client asked for a stream: flush every read
	sse        bool  // the answer is an event stream (errors after the first byte become events)
	committed  bool  // the head went to the client
	clientGone bool  // a write to the client failed
	pending    error // a read's error not yet acted on (a read can return data and an error)
	tail       [2]byte
	usage      usageScanner
	strip      bool         // the router asked for usage: its event is not the client's (streamusage.go)
	partial    []byte       // an unfinished line stripUsage kept back
	dropBlank  bool         // stripUsage took out a usage line; its blank line is still to come
	mig        *streamTrack // set when the stream can be migrated (migrate.go)
}

// commit sends the engine's status and end-to-end headers to the client.
func (rl *relay) commit() {
	h := rl.w.Header()
	copyEndToEnd(h, rl.resp.Header)
	h.Set("X-Request-Id", rl.x.reqID)
	rl.rec.status = rl.resp.StatusCode
	rl.w.WriteHeader(rl.resp.StatusCode)
	rl.committed = true
}

// emit sends data to the client; false when the client is gone.
func (rl *relay) emit(data []byte, firstToken bool) bool {
	if rl.mig != nil {
		data = rl.mig.filter(data)
	}
	if len(data) == 0 {
		return true
	}
	rl.usage.feed(data)
	if rl.strip {
		if data = rl.stripUsage(data); len(data) == 0 {
			return true
		}
	}
	// A slow client is not a silent engine: stream_idle times the engine's
	// reads only.
	rl.timer.t.Stop()
	defer rl.timer.streaming(rl.x.pol.Timeouts.StreamIdle)
	if _, err := rl.w.Write(data); err != nil {
		return false
	}
	if rl.stream && rl.fl != nil {
		rl.fl.Flush() // every event reaches the client as soon as it arrives
	}
	if len(data) >= 2 {
		copy(rl.tail[:], data[len(data)-2:])
	} else {
		rl.tail[0], rl.tail[1] = rl.tail[1], data[0]
	}
	if firstToken && !rl.rec.ttftDone {
		now := time.Now()
		if rl.sse {
			// A stream's first token; a whole response's time would include
			// its decode, so only streams teach the prefill rate.
			rl.pre.FirstToken(now.Sub(rl.sent))
			rl.g.ttft.observe(rl.x.req.Model, now.Sub(rl.sent))
		}
		rl.rec.firstByte(now)
	}
	return true
}

// hold reads the start of an event stream without sending it until an
// event carries a token (or an error, or the end), or until wait passes.
// An error means nothing was sent and the attempt may be retried.
func (rl *relay) hold(wait time.Duration) error {
	var (
		mu    sync.Mutex // orders the handler's reads with the timer's send
		held  holdBuffer
		late  bool // the bound passed: the timer sent the head and the held bytes
		ended bool // hold returned: the timer must not touch the writer
	)
	// The bound can pass while a read is blocked. The timer then sends the
	// head and the held bytes itself: the handler, blocked in Read, is not
	// using the writer, and the stream can no longer be retried.
	t := time.AfterFunc(wait, func() {
		mu.Lock()
		defer mu.Unlock()
		if ended {
			return
		}
		late = true
		rl.commit()
		rl.clientGone = !rl.emit(held.data, false)
	})
	defer t.Stop()
	for {
		n, err := rl.resp.Body.Read(rl.buf)
		mu.Lock()
		if late {
			if n > 0 && !rl.clientGone {
				rl.clientGone = !rl.emit(rl.buf[:n], true)
			}
			rl.pending, ended = err, true
			mu.Unlock()
			return nil
		}
		release := false
		if n > 0 {
			rl.timer.streaming(rl.x.pol.Timeouts.StreamIdle)
			release = held.feed(rl.buf[:n])
		}
		// A clean end (io.EOF) means the engine ended its answer itself (a
		// crash cuts it short: io.ErrUnexpectedEOF): what it sent is the answer.
		if release || errors.Is(err, io.EOF) {
			rl.commit()
			rl.clientGone = !rl.emit(held.data, true)
			rl.pending, ended = err, true
			mu.Unlock()
			return nil
		}
		if err != nil {
			ended = true
			mu.Unlock()
			return err
		}
		mu.Unlock()
	}
}

// run relays the rest of the response. Before anything reached the client a
// failure is returned for the caller to retry or answer; after, a stream
// ends with an error event and a proper end of body, and any other body is
// cut (a truncated JSON answer must not look whole).
func (rl *relay) run(ctx, uctx context.Context, r *http.Request) error {
	err := rl.pending
	for err == nil && !rl.clientGone {
		var n int
		n, err = rl.resp.Body.Read(rl.buf)
		if n > 0 {
			if !rl.committed {
				rl.commit()
			}
			rl.clientGone = !rl.emit(rl.buf[:n], true)
		}
	}
	switch {
	case rl.clientGone:
		rl.rec.status = 499 // the upstream request ends with the client's context
		return nil
	case !rl.committed && errors.Is(err, io.EOF):
		rl.commit() // an empty body
		return nil
	case !rl.committed:
		return rl.g.beforeFirstByte(rl.x, uctx, err)
	case errors.Is(err, io.EOF):
		if rl.mig != nil && len(rl.mig.pending) > 0 { // an unfinished last event: the engine's to end
			_, _ = rl.w.Write(rl.mig.pending)
		}
		if len(rl.partial) > 0 { // an unfinished last line: the engine's to end
			_, _ = rl.w.Write(rl.partial)
		}
		if p, c, ok := rl.usage.result(); ok {
			ws := rl.rec.ws
			rl.rec.tr.usage(p, c)
			ws.PromptTokens.Add(float64(p))
			ws.CompletionTokens.Add(float64(c))
			rl.wk.Live.AddGenerated(c)
			if k, ok := r.Context().Value(ctxKey{}).(*auth.Key); ok { // the key's quota and tokens
				rl.g.cfg.Auth.AddUsage(k, p, c)
			}
		}
		return nil
	}
	if ms := rl.migration(ctx, uctx, r, err); ms != nil {
		return ms
	}
	rl.broken(ctx, uctx, r, err)
	return nil
}

// migration is the signal to continue the stream elsewhere after its
// engine failed with err (migrate.go), nil when it cannot be: the client
// left, the deadline passed, or the stream is not continuable.
func (rl *relay) migration(ctx, uctx context.Context, r *http.Request, err error) *migrateSignal {
	if rl.mig == nil || r.Context().Err() != nil || ctx.Err() != nil || !rl.mig.continuable() {
		return nil
	}
	if errors.Is(context.Cause(uctx), errStreamIdle) {
		return &migrateSignal{reason: metrics.MigrationStreamIdle, err: errStreamIdle} // counted by migrate
	}
	return &migrateSignal{reason: metrics.MigrationEngineFailed, err: err}
}

// broken ends a response whose engine failed after the first byte.
func (rl *relay) broken(ctx, uctx context.Context, r *http.Request, err error) {
	if r.Context().Err() != nil {
		rl.rec.status = 499
		return
	}
	reason, code, status := "upstream_broken", "upstream_error", http.StatusBadGateway
	msg := "the engine's stream broke: " + err.Error()
	switch {
	case errors.Is(context.Cause(uctx), errStreamIdle):
		rl.g.m.UpstreamTimeouts.WithLabelValues(rl.x.req.Model, "stream_idle").Inc()
		reason, code, status = "stream_idle", "upstream_timeout", http.StatusGatewayTimeout
		msg = "the engine sent nothing for " + rl.x.pol.Timeouts.StreamIdle.String()
	case ctx.Err() != nil:
		reason, code, status = "deadline", "deadline_exceeded", http.StatusGatewayTimeout
		msg = DeadlineHeader + " passed while streaming"
	}
	rl.rec.status = status
	rl.g.log.Warn("engine stream failed after the first byte", "model", rl.x.req.Model, "worker", rl.wk.ID,
		"request_id", rl.x.reqID, "reason", reason, "error", err)
	if !rl.sse {
		panic(http.ErrAbortHandler) // the client sees a cut connection, not a short answer
	}
	rl.g.m.StreamErrors.WithLabelValues(rl.x.req.Model, reason).Inc()
	rl.errorEvent(code, msg)
}

// errorEvent ends an event stream with an error in OpenAI's shape, then
// [DONE], as vLLM ends a stream that fails.
func (rl *relay) errorEvent(code, msg string) {
	var ev []byte
	if rl.tail != [2]byte{'\n', '\n'} {
		ev = append(ev, "\n\n"...) // end the event the engine left unfinished
	}
	body, _ := json.Marshal(errorBody{apiError{Message: msg, Type: "server_error", Code: &code}})
	ev = append(ev, "data: "...)
	ev = append(ev, body...)
	ev = append(ev, "\n\ndata: [DONE]\n\n"...)
	if _, err := rl.w.Write(ev); err == nil && rl.fl != nil {
		rl.fl.Flush()
	}
}
