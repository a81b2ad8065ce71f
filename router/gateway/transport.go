package gateway

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/oasis-llm/oasis/router/gateway/h1"
	"github.com/oasis-llm/oasis/router/gateway/rawsock"
)

// Transport is the router's HTTP/1.1 client to engines: a keep-alive
// connection pool where the calling goroutine itself writes the request and
// reads the response. net/http's Transport hands every request between the
// caller and two goroutines per connection; at thousands of streams per
// second those handoffs were a large share of the router's CPU.
//
// Requests must be HTTP (not HTTPS), carry their body as GetBody-able bytes
// (http.NewRequest with a bytes.Reader), and end with the response body being
// read to EOF and closed for the connection to be reused. Cancelling the
// request's context unblocks and closes its connection.
type Transport struct {
	DialTimeout    time.Duration // default 2s
	IdleTimeout    time.Duration // idle connections older than this are closed on reuse (default 90s)
	MaxIdlePerHost int           // default 4096

	mu   sync.Mutex
	idle map[string][]*pconn // host:port → LIFO stack
}

type pconn struct {
	c        net.Conn
	br       *bufio.Reader
	bw       *bufio.Writer
	host     string
	usedAt   time.Time // when its latest request was sent: its idle age is at most now - usedAt
	onCancel func()    // pc.cancel, bound once: no closure per request
}

// cancel unblocks any read or write on the connection: a past deadline.
func (pc *pconn) cancel() { _ = pc.c.SetDeadline(time.Unix(1, 0)) }

// exchange holds one response's parsed head and body state in a single
// allocation (the fast path of readResponse).
type exchange struct {
	resp http.Response
	te   [1]string
	vals [8]string
	cb   chunkedBody
	lb   lengthBody
	body body
	hop  bool // the head had a connection-level field (isHopHeader) in resp.Header
}

var _ http.RoundTripper = (*Transport)(nil)

// RoundTrip sends req and returns the response with its body unread.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.roundTrip(req.Context(), req, time.Now(), nil)
}

// roundTrip is RoundTrip with the request's context passed apart (the
// gateway's upstream requests carry none: no WithContext copy of the request
// each time), now, a clock reading taken just before (for the idle
// connections' age: no clock read of its own), and x, when not nil, a zero
// exchange the response is read into (the gateway's, inside its own
// per-request state: no allocation of the transport's).
func (t *Transport) roundTrip(ctx context.Context, req *http.Request, now time.Time, x *exchange) (*http.Response, error) {
	if req.URL.Scheme != "http" {
		return nil, errors.New("oasis-router transport: only http:// engines are supported")
	}
	for attempt := 0; ; attempt++ {
		pc, reused, err := t.conn(ctx, req.URL.Host, now)
		if err != nil {
			return nil, err
		}
		if attempt > 0 && x != nil {
			*x = exchange{} // the failed attempt may have used it
		}
		resp, err := t.send(ctx, pc, req, now, x)
		if err == nil {
			return resp, nil
		}
		pc.c.Close()
		// A pooled connection the engine closed while idle fails before any
		// response byte: send again on a fresh one (the request never reached
		// the engine's handler).
		if reused && attempt == 0 && ctx.Err() == nil && staleConnErr(err) {
			if req.GetBody != nil {
				body, berr := req.GetBody()
				if berr == nil {
					req.Body = body
					continue
				}
			} else if s, ok := req.Body.(io.Seeker); ok {
				// A body that can rewind itself (the gateway's) needs no GetBody closure.
				if _, serr := s.Seek(0, io.SeekStart); serr == nil {
					continue
				}
			}
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, err
	}
}

func staleConnErr(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (t *Transport) send(ctx context.Context, pc *pconn, req *http.Request, now time.Time, into *exchange) (*http.Response, error) {
	pc.usedAt = now
	// Cancellation: a past deadline unblocks any read or write on the conn.
	stop := onCancel(ctx, pc.onCancel)
	if err := writeRequest(pc.bw, req); err != nil {
		stop.Stop()
		return nil, err
	}
	var ferr error
	if rc, ok := pc.c.(*rawsock.Conn); ok {
		// No read that only sees EAGAIN before the engine answers.
		ferr = rc.WriteThenAwaitRead(pc.bw)
	} else {
		ferr = pc.bw.Flush()
	}
	if ferr != nil {
		stop.Stop()
		return nil, ferr
	}
	resp, x, err := readResponse(pc.br, req, into)
	// Skip interim responses (100 Continue, 103 Early Hints): the final one follows.
	for err == nil && resp.StatusCode >= 100 && resp.StatusCode < 200 && resp.StatusCode != http.StatusSwitchingProtocols {
		if into != nil {
			*into = exchange{}
		}
		resp, x, err = readResponse(pc.br, req, into)
	}
	if err != nil {
		stop.Stop()
		return nil, err
	}
	var b *body
	if x != nil {
		b = &x.body // no allocation of its own
	} else {
		b = new(body)
	}
	*b = body{rc: resp.Body, pc: pc, t: t, stop: stop, reusable: !resp.Close && !req.Close,
		hopFree: x != nil && !x.hop}
	resp.Body = b
	return resp, nil
}

// hopFree reports whether resp, from a Transport, has no connection-level
// field (isHopHeader) in its header.
func hopFree(resp *http.Response) bool {
	b, ok := resp.Body.(*body)
	return ok && b.hopFree
}

// cancelHooker is a context that registers cancellation callbacks without
// allocating (the h1 server's request context).
type cancelHooker interface {
	CancelHook(f func()) (id uint64)
	StopHook(id uint64) bool
}

// cancelReg is one registration of onCancel.
type cancelReg struct {
	hc   cancelHooker
	id   uint64
	stop func() bool
}

// onCancel arranges for f to run once ctx is done, as context.AfterFunc.
func onCancel(ctx context.Context, f func()) cancelReg {
	if hc, ok := ctx.(cancelHooker); ok {
		return cancelReg{hc: hc, id: hc.CancelHook(f)}
	}
	return cancelReg{stop: context.AfterFunc(ctx, f)}
}

// Stop is context.AfterFunc's stop: false when f already ran or was started.
func (r cancelReg) Stop() bool {
	if r.hc != nil {
		return r.hc.StopHook(r.id)
	}
	return r.stop()
}

// writeRequest writes req as HTTP/1.1 to w. Requests with a known body
// length and no trailers (all the router sends) are written directly, in
// the header map's order; anything else goes through req.Write. net/http's
// writer sorts the headers and builds a transfer writer for every request,
// which showed in the router's profile.
func writeRequest(w *bufio.Writer, req *http.Request) error {
	hasBody := req.Body != nil && req.Body != http.NoBody
	if req.Method == "" || req.URL == nil || len(req.TransferEncoding) > 0 || req.Trailer != nil ||
		(hasBody && req.ContentLength <= 0) || (!hasBody && req.ContentLength != 0) {
		return req.Write(w)
	}
	host := req.Host
	if host == "" {
		host = req.URL.Host
	}
	if strings.IndexByte(req.Method, ' ') >= 0 {
		return req.Write(w) // let net/http report what is wrong
	}
	uri := req.URL.RequestURI()
	if strings.IndexByte(uri, ' ') >= 0 {
		return req.Write(w)
	}
	// The head is built in the writer's free buffer and committed with one
	// Write: one walk of the header map, and a field net/http must refuse
	// still goes to req.Write with nothing written. Names are checked as
	// they go; the values, host, method and target (for CR, LF and NUL,
	// which would end a line early) are checked at once in the built head:
	// it must hold exactly one CR and one LF per line written, and no NUL.
	// A vectorised count of bytes just written, where a byte loop over
	// each value was most of this function's time.
	b := w.AvailableBuffer()
	start := len(b)
	b = append(b, req.Method...)
	b = append(b, ' ')
	b = append(b, uri...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\n"...)
	lines := 2
	hasUA := false
	for k, vs := range req.Header {
		if !h1.IsToken(k) {
			return req.Write(w)
		}
		skip := false
		switch k {
		case "Host", "Content-Length", "Transfer-Encoding", "Trailer":
			skip = true // written from the request's fields
		case "Connection":
			skip = req.Close
		case "User-Agent":
			hasUA = true
		}
		if skip {
			// Not written, but still refused as before (short values).
			for _, v := range vs {
				if !h1.SafeToWrite(v) {
					return req.Write(w)
				}
			}
			continue
		}
		for _, v := range vs {
			b = append(b, k...)
			b = append(b, ": "...)
			b = append(b, v...)
			b = append(b, "\r\n"...)
		}
		lines += len(vs)
	}
	if !hasUA {
		b = append(b, "User-Agent: Go-http-client/1.1\r\n"...)
		lines++
	}
	if req.Close {
		b = append(b, "Connection: close\r\n"...)
		lines++
	}
	if hasBody || req.Method == http.MethodPost || req.Method == http.MethodPut || req.Method == http.MethodPatch {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, req.ContentLength, 10)
		b = append(b, "\r\n"...)
		lines++
	}
	if !h1.LinesSafe(b[start:], lines) {
		return req.Write(w) // a CR, LF or NUL inside a line: net/http reports it
	}
	b = append(b, "\r\n"...)
	_, err := w.Write(b)
	if err != nil || !hasBody {
		return err
	}
	var n int64
	if br, ok := req.Body.(interface {
		io.WriterTo
		Len() int
	}); ok && int64(br.Len()) == req.ContentLength {
		n, err = br.WriteTo(w) // the gateway's bytes: no LimitReader
	} else {
		n, err = io.Copy(w, io.LimitReader(req.Body, req.ContentLength))
	}
	_ = req.Body.Close()
	if err != nil {
		return err
	}
	if n != req.ContentLength {
		return fmt.Errorf("request body: %d bytes, ContentLength says %d", n, req.ContentLength)
	}
	return nil
}

// body returns the connection to the pool when read to EOF and closed.
type body struct {
	rc       io.ReadCloser
	pc       *pconn
	t        *Transport
	stop     cancelReg
	reusable bool
	hopFree  bool // resp.Header has no connection-level field (see forward)
	eof      bool
	closed   bool
	d        chunkDecoder // stream's state
	em       emitter
}

// emitter takes what stream relays: one read's decoded data, and whether
// the body ended with it.
type emitter interface {
	emit(data []byte, last bool) error
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

// errStreamUnsupported: the body cannot be relayed by stream; use Read.
var errStreamUnsupported = errors.New("stream relay not supported for this body")

// emitError carries the error of stream's emit callback.
type emitError struct{ err error }

func (e emitError) Error() string { return e.err.Error() }
func (e emitError) Unwrap() error { return e.err }

// stream relays an unread chunked body: it calls em.emit once per read from
// the engine with that read's decoded data (possibly empty) and last set
// when the body ended with it. Waiting between reads happens in the
// netpoller without the extra read that returns EAGAIN (rawsock.Relay).
// errStreamUnsupported means nothing was read: use Read instead. An error
// from emit comes back as an emitError.
func (b *body) stream(buf []byte, em emitter) error {
	rc, ok := b.pc.c.(*rawsock.Conn)
	if _, chunked := b.rc.(*chunkedBody); !ok || !chunked || b.eof || len(buf) < b.pc.br.Size() {
		return errStreamUnsupported
	}
	b.d, b.em = chunkDecoder{}, em
	defer func() { b.em = nil }()
	// What came with the response head is decoded first.
	if k := b.pc.br.Buffered(); k > 0 {
		pend, _ := b.pc.br.Peek(k)
		n := copy(buf, pend)
		_, _ = b.pc.br.Discard(n)
		if done, err := b.Feed(buf[:n]); done || err != nil {
			return err
		}
	}
	err := rc.RelayTo(buf, b)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF // the engine closed before the body's end
	}
	return err
}

// Feed decodes one read of the chunked body in place and emits its data
// (rawsock.Sink, for stream).
func (b *body) Feed(p []byte) (bool, error) {
	data, n, done, err := b.d.decode(p)
	if err != nil {
		// The data before the bad framing still goes out (and is
		// flushed), as net/http's reader returns it before the error.
		if len(data) > 0 {
			if err := b.em.emit(data, false); err != nil {
				return true, emitError{err}
			}
		}
		return true, io.ErrUnexpectedEOF
	}
	if done {
		b.eof = true
		if n < len(p) {
			b.reusable = false // bytes after the body: do not trust the connection
		}
	}
	if len(data) > 0 || done {
		if err := b.em.emit(data, done); err != nil {
			return true, emitError{err}
		}
	}
	return done, nil
}

func (b *body) Close() error {
	if b.closed {
		return nil
	}
	b.closed = true
	// stop() is false when the context already fired: the conn has a past
	// deadline and may have been cut mid-response.
	if b.stop.Stop() && b.eof && b.reusable {
		_ = b.rc.Close()
		b.t.put(b.pc)
		return nil
	}
	// Close the connection first: net/http's body.Close would otherwise read
	// the rest of an unfinished stream to discard it.
	err := b.pc.c.Close()
	_ = b.rc.Close()
	return err
}

func (t *Transport) conn(ctx context.Context, host string, now time.Time) (*pconn, bool, error) {
	idleTimeout := t.IdleTimeout
	if idleTimeout == 0 {
		idleTimeout = 90 * time.Second
	}
	t.mu.Lock()
	for stack := t.idle[host]; len(stack) > 0; stack = t.idle[host] {
		pc := stack[len(stack)-1]
		stack[len(stack)-1] = nil
		t.idle[host] = stack[:len(stack)-1]
		if now.Sub(pc.usedAt) > idleTimeout {
			pc.c.Close()
			continue
		}
		t.mu.Unlock()
		return pc, true, nil
	}
	t.mu.Unlock()
	dt := t.DialTimeout
	if dt == 0 {
		dt = 2 * time.Second
	}
	c, err := (&net.Dialer{Timeout: dt, KeepAlive: 30 * time.Second}).DialContext(ctx, "tcp", host)
	if err != nil {
		return nil, false, err
	}
	c = rawsock.Wrap(c)
	pc := &pconn{c: c, br: bufio.NewReaderSize(c, 8<<10), bw: bufio.NewWriterSize(c, 4<<10), host: host}
	pc.onCancel = pc.cancel
	return pc, false, nil
}

// put pools pc. Only connections whose cancellation hook never fired come
// here, so no deadline was set on them and none needs clearing (a deadline
// change is a runtime timer update per request). Its idle age counts from
// when its request was sent (usedAt): an overestimate, never too young,
// without a clock read here.
func (t *Transport) put(pc *pconn) {
	if pc.br.Buffered() > 0 { // the engine sent more than one response: do not trust it
		pc.c.Close()
		return
	}
	max := t.MaxIdlePerHost
	if max == 0 {
		max = 4096
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.idle == nil {
		t.idle = map[string][]*pconn{}
	}
	if len(t.idle[pc.host]) >= max {
		pc.c.Close()
		return
	}
	t.idle[pc.host] = append(t.idle[pc.host], pc)
}

// CloseIdle closes every idle connection.
func (t *Transport) CloseIdle() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for h, stack := range t.idle {
		for _, pc := range stack {
			pc.c.Close()
		}
		delete(t.idle, h)
	}
}

// readResponse reads one response. A head that arrived whole (the usual
// case: engines write it in one segment) with nothing unusual in it is parsed
// here, with fewer allocations than textproto, into an exchange (returned,
// for the transport's body); anything else, before a byte is consumed, goes
// to http.ReadResponse (and x is nil).
func readResponse(br *bufio.Reader, req *http.Request, into *exchange) (resp *http.Response, x *exchange, err error) {
	if _, err := br.Peek(1); err != nil {
		return nil, nil, err
	}
	buf, _ := br.Peek(br.Buffered())
	if x = into; x == nil {
		x = &exchange{}
	}
	n := parseResponseHeadInto(x, buf)
	if n == 0 {
		resp, err = http.ReadResponse(br, req)
		return resp, nil, err
	}
	resp = &x.resp
	_, _ = br.Discard(n)
	resp.Request = req
	switch {
	case resp.StatusCode < 200 || resp.StatusCode == http.StatusNoContent || resp.StatusCode == http.StatusNotModified ||
		req.Method == http.MethodHead:
		resp.Body = http.NoBody
		if req.Method != http.MethodHead {
			resp.ContentLength = 0
		}
	case resp.TransferEncoding != nil:
		x.cb = chunkedBody{br: br} // its decoder is made on the first Read: the stream relay decodes itself
		resp.Body = &x.cb
	case resp.ContentLength >= 0:
		x.lb = lengthBody{br: br, n: resp.ContentLength}
		resp.Body = &x.lb
		if resp.ContentLength == 0 {
			resp.Body = http.NoBody
		}
	default:
		resp.Close = true // the body ends with the connection
		resp.Body = io.NopCloser(br)
	}
	return resp, x, nil
}

// parseResponseHead parses the response head at the start of b: the status
// line and fields, each line ending in CRLF, through the blank line. ok is
// false for anything it does not handle itself.
func parseResponseHead(b []byte) (resp *http.Response, ok bool) {
	x := &exchange{}
	if parseResponseHeadInto(x, b) == 0 {
		return nil, false
	}
	return &x.resp, true
}

// headField is one field of a response head: its canonical name and where
// its value lies in the head.
type headField struct {
	key        string
	start, end int
}

// maxHeadFields is the most fields parseResponseHeadInto takes; a head with
// more goes to net/http.
const maxHeadFields = 16

// parseResponseHeadInto is parseResponseHead into x.resp, in one pass over
// the head: it returns the head's length, blank line included, or 0 when
// the head is not all in b or has anything it does not handle itself. The
// field values are slices of one string copied from the head. x must be
// new.
func parseResponseHeadInto(x *exchange, b []byte) int {
	i := bytes.IndexByte(b, '\n')
	if i < 1 || b[i-1] != '\r' {
		return 0
	}
	line := b[:i-1]
	if len(line) < 12 || string(line[:9]) != "HTTP/1.1 " || (len(line) > 12 && line[12] != ' ') {
		return 0
	}
	code := 0
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return 0
	}
	for _, c := range line[12:] {
		if c < ' ' && c != '\t' || c == 0x7f {
			return 0
		}
	}
	// The fields, up to the blank line: checked and located first, their
	// values copied once the head's end is known.
	var fields [maxHeadFields]headField
	nf := 0
	first := i + 1 // the first field line
	p := first
	for {
		// Lines end in CRLF; a bare LF is left to net/http.
		j := bytes.IndexByte(b[p:], '\n')
		if j < 1 || b[p+j-1] != '\r' {
			return 0 // also a head not all in b
		}
		if j == 1 {
			break // the blank line
		}
		line := b[p : p+j-1]
		k, v, found := bytes.Cut(line, []byte{':'})
		if !found || !h1.IsToken(k) || nf == maxHeadFields {
			return 0 // also folded lines: their name starts with a space
		}
		tv := h1.TrimOWS(v)
		if !h1.ValidValue(tv) {
			return 0
		}
		start := p + len(k) + 1 + cap(v) - cap(tv) // tv is v without its leading spaces
		fields[nf] = headField{key: h1.CanonicalKey(k), start: start, end: start + len(tv)}
		nf++
		p += j + 1
	}
	status := "200 OK"
	if string(line[9:]) != status {
		status = string(line[9:])
	}
	// x is new (zero): fields set in place, where a composite literal
	// would be built aside and copied.
	resp := &x.resp
	resp.Status, resp.StatusCode, resp.Header, resp.ContentLength = status, code, make(http.Header, nf), -1
	resp.Proto, resp.ProtoMajor, resp.ProtoMinor = "HTTP/1.1", 1, 1
	vals := x.vals[:0]
	all := string(b[first:p]) // one string for all field values: each value is a slice of it
	lengths := 0
	for fi, f := range fields[:nf] {
		vs := all[f.start-first : f.end-first]
		switch f.key {
		case "Content-Length":
			n, err := strconv.ParseInt(vs, 10, 64)
			if lengths++; lengths > 1 || err != nil || n < 0 || vs[0] == '+' {
				return 0
			}
			resp.ContentLength = n
		case "Transfer-Encoding":
			if resp.TransferEncoding != nil || vs != "chunked" {
				return 0
			}
			x.te[0] = "chunked"
			resp.TransferEncoding = x.te[:]
			continue // as net/http: not left in the header map
		case "Trailer":
			return 0 // declared trailers: net/http's business
		case "Connection":
			for _, tok := range strings.Split(vs, ",") {
				if strings.EqualFold(strings.Trim(tok, " \t"), "close") {
					resp.Close = true
				}
			}
		}
		if isHopHeader(f.key) {
			x.hop = true
		}
		// A name seen before in this head gets the value appended; a new
		// one (nearly always) is set without looking it up first.
		repeated := false
		for _, e := range fields[:fi] {
			if e.key == f.key {
				repeated = true
				break
			}
		}
		if repeated {
			resp.Header[f.key] = append(resp.Header[f.key], vs)
		} else {
			vals = append(vals, vs)
			n := len(vals)
			resp.Header[f.key] = vals[n-1 : n : n]
		}
	}
	if resp.Close {
		delete(resp.Header, "Connection") // as net/http
	}
	if resp.TransferEncoding != nil {
		if lengths > 0 {
			return 0
		}
		resp.ContentLength = -1
	}
	return p + 2
}

// chunkedBody decodes a chunked body and consumes its trailer section, so
// the connection is positioned at the next response. The last data comes
// with io.EOF when the terminator was already buffered, as net/http's does.
type chunkedBody struct {
	br  *bufio.Reader
	r   io.Reader
	err error
}

func (c *chunkedBody) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.r == nil {
		c.r = httputil.NewChunkedReader(c.br)
	}
	n, err := c.r.Read(p)
	if err == io.EOF {
		// Trailer section, read the way net/http does (and dropped).
		if b, _ := c.br.Peek(2); string(b) == "\r\n" {
			_, _ = c.br.Discard(2)
		} else if len(b) < 2 {
			err = io.ErrUnexpectedEOF
		} else if buf, _ := c.br.Peek(c.br.Buffered()); !bytes.Contains(buf, []byte("\r\n\r\n")) {
			err = io.ErrUnexpectedEOF // trailer not all there: net/http refuses it too
		} else if _, terr := textproto.NewReader(c.br).ReadMIMEHeader(); terr != nil {
			err = io.ErrUnexpectedEOF
		}
	}
	c.err = err
	return n, err
}

func (c *chunkedBody) Close() error { return nil }

// lengthBody is a body of known length.
type lengthBody struct {
	br *bufio.Reader
	n  int64
}

func (l *lengthBody) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.br.Read(p)
	l.n -= int64(n)
	switch {
	case l.n == 0:
		return n, io.EOF
	case err == io.EOF:
		return n, io.ErrUnexpectedEOF
	}
	return n, err
}

func (l *lengthBody) Close() error { return nil }
