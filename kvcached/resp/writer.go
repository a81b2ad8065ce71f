package resp

import (
	"io"
	"net"
	"strconv"
)

// Writer writes replies in RESP2 or, after HELLO 3, RESP3. Only the types
// kvcached replies with are covered; RESP3 differs from RESP2 here in nulls
// and maps.
//
// Replies are buffered until Flush or until the buffer fills. A large bulk
// reply is not copied into the buffer: what is buffered, the bulk header, the
// value and its CRLF go out in one writev.
type Writer struct {
	bw    *bufWriter
	resp3 bool
	num   [24]byte
}

// largeBulk is the bulk size from which Bulk writes the value directly.
const largeBulk = 32 << 10

// NewWriter returns a RESP2 Writer over dst that buffers size bytes.
func NewWriter(dst io.Writer, size int) *Writer {
	return &Writer{bw: &bufWriter{dst: dst, buf: make([]byte, 0, size)}}
}

// Grow replaces the reply buffer by one of size bytes, unless it is already
// that large, keeping the replies it holds.
func (w *Writer) Grow(size int) {
	if cap(w.bw.buf) >= size {
		return
	}
	nb := make([]byte, len(w.bw.buf), size)
	copy(nb, w.bw.buf)
	w.bw.buf = nb
}

// BufferSize is the reply buffer's size.
func (w *Writer) BufferSize() int { return cap(w.bw.buf) }

// bufWriter is bufio.Writer's subset used here, with access to the buffered
// bytes so a large value can join them in one writev. Errors are sticky.
type bufWriter struct {
	dst io.Writer
	buf []byte
	err error
}

func (b *bufWriter) room(n int) {
	if len(b.buf)+n > cap(b.buf) && len(b.buf) > 0 {
		b.Flush()
	}
}

func (b *bufWriter) writeByte(c byte) {
	b.room(1)
	b.buf = append(b.buf, c)
}

func (b *bufWriter) writeString(s string) {
	if len(s) > cap(b.buf) {
		b.write([]byte(s))
		return
	}
	b.room(len(s))
	b.buf = append(b.buf, s...)
}

func (b *bufWriter) write(p []byte) {
	if len(p) < largeBulk || len(p) <= cap(b.buf)-len(b.buf) {
		b.room(len(p))
		b.buf = append(b.buf, p...)
		return
	}
	b.writev(p, nil)
}

// writev sends the buffered bytes, p and tail in one call.
func (b *bufWriter) writev(p, tail []byte) {
	if b.err != nil {
		return
	}
	bufs := net.Buffers{b.buf, p, tail}
	_, b.err = bufs.WriteTo(b.dst)
	b.buf = b.buf[:0]
}

func (b *bufWriter) Flush() error {
	if b.err == nil && len(b.buf) > 0 {
		_, b.err = b.dst.Write(b.buf)
	}
	b.buf = b.buf[:0]
	return b.err
}

// SetProtocol selects RESP3 (3) or RESP2 (anything else).
func (w *Writer) SetProtocol(v int) { w.resp3 = v == 3 }

// Protocol returns 3 or 2.
func (w *Writer) Protocol() int {
	if w.resp3 {
		return 3
	}
	return 2
}

// Flush sends buffered replies.
func (w *Writer) Flush() error { return w.bw.Flush() }

func (w *Writer) line(prefix byte, s string) {
	w.bw.writeByte(prefix)
	w.bw.writeString(s)
	w.bw.writeString("\r\n")
}

func (w *Writer) intLine(prefix byte, n int64) {
	w.bw.writeByte(prefix)
	w.bw.write(strconv.AppendInt(w.num[:0], n, 10))
	w.bw.writeString("\r\n")
}

// Simple writes a simple string such as OK.
func (w *Writer) Simple(s string) { w.line('+', s) }

// OK writes +OK.
func (w *Writer) OK() { w.bw.writeString("+OK\r\n") }

// Error writes an error reply; msg should start with an error code such as
// "ERR" or "WRONGPASS". CR and LF are replaced so the reply stays one line.
func (w *Writer) Error(msg string) {
	b := []byte(msg)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	w.bw.writeByte('-')
	w.bw.write(b)
	w.bw.writeString("\r\n")
}

// Int writes an integer reply.
func (w *Writer) Int(n int64) { w.intLine(':', n) }

// Bulk writes a bulk string. It does not keep b once it returns (a large b
// is written out, a small one copied), so b may be reused right after.
func (w *Writer) Bulk(b []byte) {
	w.intLine('$', int64(len(b)))
	if len(b) >= largeBulk {
		w.bw.writev(b, crlf)
		return
	}
	w.bw.write(b)
	w.bw.writeString("\r\n")
}

var crlf = []byte("\r\n")

// BulkString writes a bulk string from s.
func (w *Writer) BulkString(s string) {
	w.intLine('$', int64(len(s)))
	w.bw.writeString(s)
	w.bw.writeString("\r\n")
}

// Null writes the null reply: $-1 in RESP2, _ in RESP3.
func (w *Writer) Null() {
	if w.resp3 {
		w.bw.writeString("_\r\n")
		return
	}
	w.bw.writeString("$-1\r\n")
}

// Array writes an array header of n elements; the caller writes them.
func (w *Writer) Array(n int) { w.intLine('*', int64(n)) }

// Map writes a map header of n pairs: %n in RESP3, an array of 2n in RESP2.
func (w *Writer) Map(n int) {
	if w.resp3 {
		w.intLine('%', int64(n))
		return
	}
	w.intLine('*', int64(2*n))
}

// Verbatim writes a text blob such as INFO's: a verbatim string in RESP3, a
// bulk string in RESP2.
func (w *Writer) Verbatim(s string) {
	if w.resp3 {
		w.intLine('=', int64(len(s)+4))
		w.bw.writeString("txt:")
		w.bw.writeString(s)
		w.bw.writeString("\r\n")
		return
	}
	w.BulkString(s)
}
