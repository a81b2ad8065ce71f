package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"runtime/debug"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/oasis-llm/oasis/router/gateway/rawsock"
)

// maxDiscard is how much of a request body a handler left unread is read
// and dropped to keep the connection; past it the connection is closed.
const maxDiscard = 256 << 10

type conn struct {
	srv    *Server
	c      net.Conn
	remote string
	br     *bufio.Reader
	bw     *bufio.Writer
	pend   []byte        // held-back response body, reused across requests
	jobs   chan job      // to the handler goroutine
	done   chan struct{} // from it, one value per finished job
	state  atomic.Int32
	last   atomic.Int64 // unix nanoseconds of the last state change

	// With hangups (Linux), handlers run on the connection's goroutine and
	// the server's hangup watcher cancels them (see hangups).
	hangups  *hangups
	watched  bool
	hangupID int32
	raw      syscall.RawConn
	gone     atomic.Bool              // the client hung up
	cur      atomic.Pointer[response] // the running request, once read whole

	// With hangups and a raw socket, requests are read and handled inside
	// one rawsock Hold (serveHeld), which reports back through these.
	rs       *rawsock.Conn
	heldFn   func() bool
	maxHead  int
	held     heldExit
	heldEx   *exchange   // heldHandle: the request to handle outside Hold
	heldPerr *protoError // heldReject
	heldHow  closeHow    // heldDone: how to close
}

// heldExit is why serveHeld left its Hold.
type heldExit int8

const (
	heldDone     heldExit = iota // the connection is done (heldHow says how to close it)
	heldReadHead                 // a head longer than the read buffer: read it the usual way
	heldHandle                   // heldEx's body is still to come: handle it the usual way
	heldReject                   // heldPerr: answer it and close
)

// closeHow is how a connection ends after a request.
type closeHow int8

const (
	keepOpen      closeHow = iota
	closeNow               // close at once (a cut response, or an error)
	closeGraceful          // FIN first (closeGracefully)
	closeDrain             // FIN, then drop what the client still sends (closeDraining)
)

// closeAs ends the connection as how says.
func (cn *conn) closeAs(how closeHow) {
	switch how {
	case closeNow:
		cn.c.Close()
	case closeGraceful:
		closeGracefully(cn.c)
	case closeDrain:
		closeDraining(cn.c)
	}
}

// closeIfIdle closes the connection when no request is being handled.
func (cn *conn) closeIfIdle() {
	if cn.state.CompareAndSwap(stateIdle, stateClosed) || cn.state.CompareAndSwap(stateHeader, stateClosed) {
		cn.c.Close()
	}
}

// serve reads requests one after the other. With the server's hangup
// watcher (Linux) it runs each handler itself (handleInline). Otherwise
// handlers run in the connection's worker goroutine while this goroutine
// waits for the client's next byte, which is either the next (pipelined or
// keep-alive) request or the end of the connection, which cancels the
// running request (handle).
func (cn *conn) serve() {
	s := cn.srv
	cn.br, cn.bw = s.getReader(cn.c), s.getWriter(cn.c)
	cn.pend = make([]byte, 0, pendingMax)
	if cn.hangups != nil && cn.hangups.add(cn) {
		cn.watched = true
		defer cn.hangups.remove(cn)
	}
	defer func() {
		if cn.jobs != nil {
			close(cn.jobs)
		}
		cn.state.Store(stateClosed)
		cn.c.Close()
		s.forget(cn)
		s.putBuffers(cn.br, cn.bw)
	}()
	cn.maxHead = s.MaxHeaderBytes
	if cn.maxHead <= 0 {
		cn.maxHead = 1 << 20
	}
	if rs, ok := cn.c.(*rawsock.Conn); ok && cn.watched {
		cn.rs, cn.heldFn = rs, cn.serveHeld
	}
	for {
		var ex *exchange
		if cn.rs != nil {
			cn.held, cn.heldEx, cn.heldPerr, cn.heldHow = heldDone, nil, nil, closeNow
			if err := cn.rs.Hold(cn.heldFn); err != nil {
				return
			}
			switch cn.held {
			case heldDone:
				cn.closeAs(cn.heldHow)
				return
			case heldReject:
				cn.protocolError(cn.heldPerr)
				return
			case heldHandle:
				ex = cn.heldEx
			}
			// heldReadHead: the state is stateHeader already.
		} else {
			if cn.br.Buffered() == 0 {
				if _, err := cn.br.Peek(1); err != nil {
					return
				}
			}
			if !cn.startHead() {
				return
			}
		}
		if ex == nil {
			ex = &exchange{}
			perr, err := readHeadInto(cn.br, cn.maxHead, &ex.h)
			if err != nil {
				return
			}
			if perr != nil {
				cn.state.Store(stateActive)
				cn.protocolError(perr)
				return
			}
			if !cn.state.CompareAndSwap(stateHeader, stateActive) {
				return
			}
		}
		if !cn.handle(ex) {
			return
		}
	}
}

// startHead marks the connection as reading a request's head, on its first
// byte. Losing this race to Shutdown or the sweeper closed the connection;
// winning it means a request that arrived during Shutdown is still answered
// (with Connection: close).
func (cn *conn) startHead() bool {
	if !cn.state.CompareAndSwap(stateIdle, stateHeader) {
		return false
	}
	cn.last.Store(cn.srv.clock.Load())
	return true
}

// serveHeld reads and handles requests inside the socket's Hold, so that
// waiting for the next keep-alive request needs no read that finds nothing
// (see rawsock.Conn.Hold). It leaves the Hold (returning true, with cn.held
// saying why) for whatever may block on reading the socket or close it: a
// head longer than the read buffer, a body not all read with the head, a
// rejected request, the connection's end. false waits for the socket.
func (cn *conn) serveHeld() bool {
	br := cn.br
	for {
		if br.Buffered() == 0 {
			if cn.rs.Drained() {
				// Nothing came since the last read: wait. Bytes that came
				// meanwhile end the wait at once.
				return false
			}
			if _, err := br.Peek(1); err != nil {
				return !errors.Is(err, rawsock.ErrWouldBlock)
			}
		}
		if cn.state.Load() != stateHeader && !cn.startHead() {
			return true
		}
		buf, _ := br.Peek(br.Buffered())
		if !headEnds(buf) {
			if len(buf) == br.Size() {
				cn.held = heldReadHead
				return true
			}
			if _, err := br.Peek(len(buf) + 1); err != nil {
				return !errors.Is(err, rawsock.ErrWouldBlock)
			}
			continue
		}
		// The whole head is buffered: readHead reads nothing from the socket.
		ex := &exchange{}
		h := &ex.h
		perr, err := readHeadInto(br, cn.maxHead, h)
		if err != nil {
			return true
		}
		if perr != nil {
			cn.state.Store(stateActive)
			cn.held, cn.heldPerr = heldReject, perr
			return true
		}
		if !cn.state.CompareAndSwap(stateHeader, stateActive) {
			return true
		}
		if h.chunked || h.contentLength > int64(br.Buffered()) {
			cn.held, cn.heldEx = heldHandle, ex
			return true
		}
		// The body (if any) is buffered too: the handler's reads of it
		// never reach the socket.
		if how := cn.handleInline(ex); how != keepOpen {
			cn.heldHow = how
			return true
		}
	}
}

// headEnds reports whether b holds the end of a request head (an empty line,
// CRLF or LF terminated, as readLine reads them).
func headEnds(b []byte) bool {
	return bytes.Contains(b, []byte("\r\n\r\n")) || bytes.Contains(b, []byte("\n\n")) ||
		bytes.Contains(b, []byte("\n\r\n")) || bytes.HasPrefix(b, []byte("\n")) || bytes.HasPrefix(b, []byte("\r\n"))
}

// openBody sets b up as the body of h's request and returns what the handler
// reads (http.NoBody without one). With copyBuffered, a body that came whole
// with the head (the usual small API request) is copied out, so the
// connection's goroutine can wait on the socket at once.
func (cn *conn) openBody(b *body, h *head, copyBuffered bool) io.ReadCloser {
	*b = body{br: cn.br, remaining: h.contentLength, expectContinue: h.expectContinue}
	switch {
	case h.chunked:
		b.chunked = httputil.NewChunkedReader(cn.br)
	case copyBuffered && h.contentLength > 0 && int(h.contentLength) <= cn.br.Buffered():
		buf := make([]byte, h.contentLength)
		_, _ = io.ReadFull(cn.br, buf)
		b.buf, b.remaining, b.eof = buf, 0, true
	case h.contentLength > 0:
	default:
		b.eof = true
		return http.NoBody
	}
	return b
}

// handle runs the request whose head is in ex; false means the connection
// is done.
func (cn *conn) handle(ex *exchange) bool {
	if cn.watched {
		how := cn.handleInline(ex)
		cn.closeAs(how)
		return how == keepOpen
	}
	h := &ex.h
	b := &ex.b
	rbody := cn.openBody(b, h, true)
	if !b.eof {
		b.done = make(chan struct{})
	}
	r, w := ex.start(cn, h, rbody)
	if cn.jobs == nil {
		// One handler goroutine per connection, reused: a fresh goroutine
		// per request grew its stack to the handler's depth every time.
		cn.jobs, cn.done = make(chan job), make(chan struct{}, 1)
		go cn.worker()
	}
	cn.jobs <- job{w: w, r: r}

	finished := false
	if b.done != nil {
		select {
		case <-b.done:
		case <-cn.done:
			finished = true
		}
	}
	if !finished {
		select {
		case <-cn.done:
			finished = true
		default:
		}
	}
	if !finished {
		// The handler is still running: wait for the client. Bytes mean the
		// next request (answered after this one); an error means it left.
		if _, err := cn.br.Peek(1); err != nil {
			ex.ctx.cancel()
			<-cn.done
			return false
		}
		<-cn.done
	}
	return keepAfter(w, b)
}

// keepAfter reports whether the connection serves another request after w
// answered the request whose body is b: not when the response closes it, nor
// when more of the body is left unread than is worth discarding.
func keepAfter(w *response, b *body) bool {
	if w.closeAfter {
		return false
	}
	if !b.eof {
		// Unread body the response promised to keep the connection for.
		if _, err := io.Copy(io.Discard, io.LimitReader(b, maxDiscard+1)); err != nil || !b.eof {
			return false
		}
	}
	return true
}

// handleInline runs one request on the connection's goroutine; the hangup
// watcher cancels it if the client leaves. The caller closes the connection
// as the result says.
func (cn *conn) handleInline(ex *exchange) closeHow {
	h := &ex.h
	b := &ex.b
	r, w := ex.start(cn, h, cn.openBody(b, h, false))
	if b.eof {
		cn.arm(w)
	} // else when the handler has read the body (body.end)
	how := cn.run(w, r)
	cn.cur.Store(nil)
	if how == keepOpen && !keepAfter(w, b) {
		how = closeNow
	}
	return how
}

// arm makes w cancellable by a hangup, once its request was read whole. A
// client that sent more (pipelined requests) and then closed is answered,
// as before: only a hangup with nothing left unread cancels.
func (cn *conn) arm(w *response) {
	if cn.br.Buffered() > 0 {
		return
	}
	cn.cur.Store(w)
	if cn.gone.Load() {
		w.hangup()
	}
}

// hangup is called by the hangup watcher when the client half-closed or
// reset the connection.
func (cn *conn) hangup() {
	cn.gone.Store(true)
	if w := cn.cur.Load(); w != nil {
		w.hangup()
	}
}

type job struct {
	w *response
	r *http.Request
}

// exchange is one request's server-side state, in a single allocation (but
// for the http.Request: see start).
type exchange struct {
	h   head
	ctx reqCtx
	b   body
	w   response
	te  [1]string
}

// start fills in the request and response for h, whose body is ex.b.
func (ex *exchange) start(cn *conn, h *head, rbody io.ReadCloser) (*http.Request, *response) {
	// WithContext, the only way to set a request's context, copies it to the
	// heap: the template stays on the stack.
	tmpl := http.Request{Method: h.method, URL: h.url, Proto: protoString(h.minor), ProtoMajor: h.major, ProtoMinor: h.minor,
		Header: h.header, Body: rbody, ContentLength: max(h.contentLength, 0), Close: h.close, Host: h.host,
		RemoteAddr: cn.remote, RequestURI: h.target}
	if h.chunked {
		ex.te[0] = "chunked"
		tmpl.ContentLength = -1
		tmpl.TransferEncoding = ex.te[:]
	}
	r := tmpl.WithContext(&ex.ctx)
	w := &ex.w
	*w = response{cn: cn, req: r, cl: -1, body: &ex.b, minor: h.minor,
		head: h.method == http.MethodHead, closeAfter: h.close, pending: cn.pend[:0], ctx: &ex.ctx}
	ex.b.w = w
	return r, w
}

// worker runs the connection's handlers, one at a time.
func (cn *conn) worker() {
	for j := range cn.jobs {
		cn.closeAs(cn.run(j.w, j.r))
		cn.done <- struct{}{}
	}
}

// run calls the handler and finishes the response; the caller closes the
// connection as the result says (run may run inside a Hold, which must not
// close it).
func (cn *conn) run(w *response, r *http.Request) (how closeHow) {
	defer w.ctx.cancel()
	defer func() {
		if p := recover(); p != nil {
			if p != http.ErrAbortHandler {
				cn.srv.logger().Error("handler panicked", "method", r.Method, "uri", r.RequestURI, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			}
			// Cut the response: what was buffered goes out, the end of a
			// chunked body does not, so the client sees it broken.
			w.closeAfter = true
			_ = cn.bw.Flush()
			cn.state.Store(stateClosed)
			how = closeNow
			return
		}
		w.finish()
		if w.closeAfter || cn.srv.shutdown.Load() {
			w.closeAfter = true
			cn.state.Store(stateClosed)
			if w.body.eof {
				how = closeGraceful
			} else {
				how = closeDrain
			}
			return
		}
		cn.last.Store(cn.srv.clock.Load())
		cn.state.Store(stateIdle)
	}()
	cn.srv.Handler.ServeHTTP(w, r)
	return keepOpen
}

// closeGracefully sends FIN before closing, so a response is not lost to a
// reset caused by request bytes the server did not read.
func closeGracefully(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
	}
	c.Close()
}

// closeDraining closes a connection whose request was not read to its end:
// after sending FIN it reads and drops what the client still sends (for at
// most half a second), since closing with unread data would reset the
// connection and could destroy the response before the client reads it.
func closeDraining(c net.Conn) {
	if tc, ok := c.(interface{ CloseWrite() error }); ok {
		_ = tc.CloseWrite()
		_ = c.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
		_, _ = io.Copy(io.Discard, io.LimitReader(c, 1<<20))
	}
	c.Close()
}

// protocolError answers a request the server rejected and closes.
func (cn *conn) protocolError(pe *protoError) {
	w := &response{cn: cn, header: make(http.Header, 4), cl: -1, minor: 1, closeAfter: true, body: &body{eof: true}}
	if f := cn.srv.ProtocolError; f != nil {
		f(w, pe.status, pe.msg)
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(pe.status)
		_, _ = io.WriteString(w, pe.msg+"\n")
	}
	w.finish()
	closeDraining(cn.c)
}

func protoString(minor int) string {
	if minor == 0 {
		return "HTTP/1.0"
	}
	return "HTTP/1.1"
}

// body is a request body. The handler's goroutine reads it; the connection
// goroutine touches it again only after done was closed or the handler ended.
type body struct {
	br             *bufio.Reader
	buf            []byte    // whole body read ahead, when it came with the head
	chunked        io.Reader // chunked decoder, or nil
	remaining      int64     // Content-Length bytes left
	eof            bool
	err            error
	done           chan struct{} // closed at the end of the body
	w              *response
	expectContinue bool
}

func (b *body) Read(p []byte) (int, error) {
	if b.buf != nil {
		n := copy(p, b.buf)
		b.buf = b.buf[n:]
		if len(b.buf) == 0 {
			b.buf = nil
			if n == 0 {
				return 0, io.EOF
			}
		}
		return n, nil
	}
	if b.eof {
		return 0, io.EOF
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.expectContinue {
		b.expectContinue = false
		if !b.w.committed {
			_, _ = b.w.cn.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			if err := b.w.cn.bw.Flush(); err != nil {
				b.err = err
				return 0, err
			}
		}
	}
	var n int
	var err error
	if b.chunked != nil {
		n, err = b.chunked.Read(p)
		if err == io.EOF {
			if terr := b.readTrailer(); terr != nil {
				err = terr
			} else {
				b.end()
			}
		}
	} else {
		if int64(len(p)) > b.remaining {
			p = p[:b.remaining]
		}
		n, err = b.br.Read(p)
		b.remaining -= int64(n)
		if b.remaining == 0 {
			b.end()
			err = io.EOF
		} else if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
	}
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// readTrailer skips the trailer section after the last chunk (the
// router forwards no trailers).
func (b *body) readTrailer() error {
	budget := 8 << 10
	for {
		line, err := readLine(b.br, &budget)
		if err != nil {
			return errors.New("reading chunked body trailer: " + err.Error())
		}
		if len(line) == 0 {
			return nil
		}
	}
}

func (b *body) end() {
	b.eof = true
	if b.done != nil {
		close(b.done)
	}
	if b.w != nil && b.w.cn.watched {
		b.w.cn.arm(b.w)
	}
}

// Close is a no-op: an unread body is dealt with when the handler returns.
func (b *body) Close() error { return nil }
