package h1

import (
	"bufio"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// pendingMax is how much body a response holds back before committing to a
// framing: a response finished within it goes out with a Content-Length,
// headers and body in one write.
const pendingMax = 4 << 10

// response is the http.ResponseWriter. Headers are written together with
// the first body bytes (or at the end), never alone.
type response struct {
	cn          *conn
	req         *http.Request // nil for the server's own error responses
	header      http.Header
	status      int
	wroteHeader bool
	committed   bool
	chunked     bool
	head        bool  // HEAD request: no body goes out
	cl          int64 // declared Content-Length, -1 if none
	written     int64
	pending     []byte
	minor       int
	closeAfter  bool
	err         error // sticky write error
	body        *body
	ctx         *reqCtx // the request's context (hangup watcher)
}

// hangup cancels the request when the client left with nothing unread in
// the socket (pipelined requests are still answered).
func (w *response) hangup() {
	if unread(w.cn.raw) == 0 {
		w.ctx.cancel()
	}
}

var errContentLength = errors.New("h1: wrote more than the declared Content-Length")

// Header returns the header map, made on first use (a proxy may hand its
// own over instead: SetHeader).
func (w *response) Header() http.Header {
	if w.header == nil {
		w.header = make(http.Header, 8)
	}
	return w.header
}

// SetHeader makes h the response's header map, when nothing was set or
// written yet: a proxy passes its upstream response's header on without
// copying it. It reports whether it did; the caller must not change h
// afterwards other than through the response.
func (w *response) SetHeader(h http.Header) bool {
	if w.wroteHeader || w.committed || len(w.header) > 0 || h == nil {
		return false
	}
	w.header = h
	return true
}

func (w *response) WriteHeader(code int) {
	if w.wroteHeader || w.committed {
		return
	}
	if code < 100 || code > 999 {
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code < 200 {
		if code == http.StatusSwitchingProtocols {
			return // no upgrades
		}
		// Interim response: status line and current headers, sent now.
		bw := w.cn.bw
		writeStatus(bw, code)
		writeHeaders(bw, w.header)
		_, _ = bw.WriteString("\r\n")
		w.setErr(bw.Flush())
		return
	}
	w.wroteHeader = true
	w.status = code
	// The canonical key looked up directly: Header.Get and Del would
	// canonicalise the constant on every response.
	if vs := w.header["Content-Length"]; len(vs) > 0 && vs[0] != "" {
		if n, ok := parseLength(strings.TrimSpace(vs[0])); ok {
			w.cl = n
		} else {
			delete(w.header, "Content-Length")
		}
	}
}

func (w *response) bodyAllowed() bool {
	return w.status != http.StatusNoContent && w.status != http.StatusNotModified
}

func (w *response) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.bodyAllowed() {
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.cl >= 0 && w.written+int64(len(p)) > w.cl {
		return 0, errContentLength
	}
	if w.head {
		w.written += int64(len(p))
		return len(p), nil
	}
	if !w.committed {
		if len(w.pending)+len(p) <= pendingMax {
			w.pending = append(w.pending, p...)
			w.written += int64(len(p))
			return len(p), nil
		}
		w.commit(false, p)
	}
	w.writeBody(p)
	w.written += int64(len(p))
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

func (w *response) writeBody(p []byte) {
	if len(p) == 0 || w.err != nil {
		return
	}
	bw := w.cn.bw
	if w.chunked {
		// The chunk size line is formatted straight into the writer's buffer.
		_, _ = bw.Write(append(strconv.AppendInt(bw.AvailableBuffer(), int64(len(p)), 16), '\r', '\n'))
		_, _ = bw.Write(p)
		_, err := bw.WriteString("\r\n")
		w.setErr(err)
		return
	}
	_, err := bw.Write(p)
	w.setErr(err)
}

func (w *response) setErr(err error) {
	if err != nil && w.err == nil {
		w.err = err
		w.closeAfter = true
	}
}

// Flush sends everything written so far.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError sends everything written so far (http.ResponseController).
func (w *response) FlushError() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(false, nil)
	}
	if w.err != nil {
		return w.err
	}
	w.setErr(w.cn.bw.Flush())
	return w.err
}

// commit writes the status line and headers, choosing the body framing,
// then the held-back body. next is the write that made it commit, if any
// (for sniffing the content type when nothing was held back).
func (w *response) commit(final bool, next []byte) {
	w.committed = true
	h := w.Header()
	bodyOK := w.bodyAllowed()
	writeCL := false
	switch {
	case !bodyOK:
		h.Del("Content-Length")
	case w.cl >= 0:
	case final:
		w.cl = int64(len(w.pending))
		if w.head {
			w.cl = w.written // what a GET would have sent
		}
		writeCL = !w.head || w.cl > 0
	case w.minor == 0:
		w.closeAfter = true // no chunking in HTTP/1.0: the close ends the body
	default:
		w.chunked = !w.head
	}
	if b := w.body; b != nil && !b.eof && (b.chunked != nil || b.remaining > maxDiscard || b.expectContinue) {
		// Too much left unread to drop and keep the connection, or a body the
		// client will not send because it never got its 100 Continue.
		w.closeAfter = true
	}
	if w.cn.srv.shutdown.Load() {
		w.closeAfter = true
	}
	if _, ok := h["Content-Type"]; !ok && bodyOK && !w.head {
		if sniff := w.pending; len(sniff) > 0 || len(next) > 0 {
			if len(sniff) == 0 {
				sniff = next
			}
			h.Set("Content-Type", http.DetectContentType(sniff))
		}
	}
	bw := w.cn.bw
	writeStatus(bw, w.status)
	// One walk of h writes it and notes what decides the lines the server
	// adds after it.
	hasDate, connClose := writeHeaders(bw, h)
	if connClose {
		w.closeAfter = true
	}
	if w.chunked {
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	if w.closeAfter {
		_, _ = bw.WriteString("Connection: close\r\n")
	}
	if writeCL {
		_, _ = bw.WriteString("Content-Length: ")
		writeDecimal(bw, w.cl)
		_, _ = bw.WriteString("\r\n")
	}
	if !hasDate {
		_, _ = bw.WriteString("Date: ")
		_, _ = bw.WriteString(*w.cn.srv.date.Load())
		_, _ = bw.WriteString("\r\n")
	}
	_, err := bw.WriteString("\r\n")
	w.setErr(err)
	p := w.pending
	w.pending = nil
	w.writeBody(p)
}

// finish completes the response after the handler returned.
func (w *response) finish() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.committed {
		w.commit(true, nil)
	}
	bw := w.cn.bw
	if w.chunked {
		_, err := bw.WriteString("0\r\n\r\n")
		w.setErr(err)
	}
	if w.cl >= 0 && w.written != w.cl && !w.head && w.bodyAllowed() {
		w.closeAfter = true // short body: the client must see the connection end
	}
	w.setErr(bw.Flush())
}

type stringWriter interface {
	WriteString(string) (int, error)
}

func writeStatus(bw stringWriter, code int) {
	switch code {
	case http.StatusOK:
		_, _ = bw.WriteString("HTTP/1.1 200 OK\r\n")
		return
	}
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	_, _ = bw.WriteString("HTTP/1.1 " + strconv.Itoa(code) + " " + text + "\r\n")
}

// writeHeaders writes h, less the hop-by-hop headers the server manages and
// any name or value that would break the header block. It reports whether h
// has a Date, and whether its Connection header asks to close.
//
// All lines are built in the writer's free space and their values checked
// at once (exactly one CR and one LF per line, no NUL: vectorised counts
// over bytes just written), then committed with one Write; a byte loop per
// value was most of this function's time. When they do not fit, or a name
// or value is bad, nothing is committed and writeHeadersChecked writes h.
func writeHeaders(bw *bufio.Writer, h http.Header) (hasDate, connClose bool) {
	b := bw.AvailableBuffer()
	lines := 0
	for k, vs := range h {
		if managed(k, vs, &hasDate, &connClose) {
			continue
		}
		if !IsToken(k) {
			return writeHeadersChecked(bw, h)
		}
		for _, v := range vs {
			if len(b)+len(k)+len(v)+4 > cap(b) {
				return writeHeadersChecked(bw, h) // appending would allocate
			}
			b = append(b, k...)
			b = append(b, ':', ' ')
			b = append(b, v...)
			b = append(b, '\r', '\n')
		}
		lines += len(vs)
	}
	if !LinesSafe(b, lines) {
		return writeHeadersChecked(bw, h)
	}
	_, _ = bw.Write(b)
	return hasDate, connClose
}

// managed notes what the server must know of a header it manages itself (a
// Date, a Connection that asks to close) and reports whether the field is
// left out of the written header (hop-by-hop fields the server writes).
func managed(k string, vs []string, hasDate, connClose *bool) (skip bool) {
	switch k {
	case "Connection":
		for _, v := range vs {
			if containsFold(v, "close") {
				*connClose = true
			}
		}
		return true
	case "Transfer-Encoding", "Keep-Alive", "Trailer", "Upgrade":
		return true
	case "Date":
		*hasDate = true // even nil: the handler suppressed it (as net/http)
	}
	return false
}

// writeHeadersChecked is writeHeaders checking each name and value as it
// goes, leaving out the bad ones.
func writeHeadersChecked(bw *bufio.Writer, h http.Header) (hasDate, connClose bool) {
	for k, vs := range h {
		if managed(k, vs, &hasDate, &connClose) {
			continue
		}
		if !IsToken(k) {
			continue
		}
		for _, v := range vs {
			if !SafeToWrite(v) {
				continue
			}
			if len(k)+len(v)+4 <= bw.Available() {
				// The line built in the writer's free space: one Write.
				b := append(bw.AvailableBuffer(), k...)
				b = append(b, ':', ' ')
				b = append(b, v...)
				_, _ = bw.Write(append(b, '\r', '\n'))
				continue
			}
			_, _ = bw.WriteString(k)
			_, _ = bw.WriteString(": ")
			_, _ = bw.WriteString(v)
			_, _ = bw.WriteString("\r\n")
		}
	}
	return hasDate, connClose
}

// containsFold reports whether s contains the lower-case ASCII word sub, in
// any case.
func containsFold(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if strings.EqualFold(s[i:i+len(sub)], sub) {
			return true
		}
	}
	return false
}

// writeDecimal writes n ≥ 0 in decimal without the string strconv would
// allocate.
func writeDecimal(bw interface{ WriteByte(byte) error }, n int64) {
	d := int64(1)
	for d <= n/10 {
		d *= 10
	}
	for ; d > 0; d /= 10 {
		_ = bw.WriteByte(byte('0' + n/d%10))
	}
}
