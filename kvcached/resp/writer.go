package resp

import (
	"bufio"
	"strconv"
)

// Writer writes replies in RESP2 or, after HELLO 3, RESP3. Only the types
// kvcached replies with are covered; RESP3 differs from RESP2 here in nulls
// and maps.
type Writer struct {
	bw    *bufio.Writer
	resp3 bool
	num   [24]byte
}

// NewWriter returns a RESP2 Writer over bw.
func NewWriter(bw *bufio.Writer) *Writer { return &Writer{bw: bw} }

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
	w.bw.WriteByte(prefix)
	w.bw.WriteString(s)
	w.bw.WriteString("\r\n")
}

func (w *Writer) intLine(prefix byte, n int64) {
	w.bw.WriteByte(prefix)
	w.bw.Write(strconv.AppendInt(w.num[:0], n, 10))
	w.bw.WriteString("\r\n")
}

// Simple writes a simple string such as OK.
func (w *Writer) Simple(s string) { w.line('+', s) }

// OK writes +OK.
func (w *Writer) OK() { w.bw.WriteString("+OK\r\n") }

// Error writes an error reply; msg should start with an error code such as
// "ERR" or "WRONGPASS". CR and LF are replaced so the reply stays one line.
func (w *Writer) Error(msg string) {
	b := []byte(msg)
	for i, c := range b {
		if c == '\r' || c == '\n' {
			b[i] = ' '
		}
	}
	w.bw.WriteByte('-')
	w.bw.Write(b)
	w.bw.WriteString("\r\n")
}

// Int writes an integer reply.
func (w *Writer) Int(n int64) { w.intLine(':', n) }

// Bulk writes a bulk string.
func (w *Writer) Bulk(b []byte) {
	w.intLine('$', int64(len(b)))
	w.bw.Write(b)
	w.bw.WriteString("\r\n")
}

// BulkString writes a bulk string from s.
func (w *Writer) BulkString(s string) {
	w.intLine('$', int64(len(s)))
	w.bw.WriteString(s)
	w.bw.WriteString("\r\n")
}

// Null writes the null reply: $-1 in RESP2, _ in RESP3.
func (w *Writer) Null() {
	if w.resp3 {
		w.bw.WriteString("_\r\n")
		return
	}
	w.bw.WriteString("$-1\r\n")
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
		w.bw.WriteString("txt:")
		w.bw.WriteString(s)
		w.bw.WriteString("\r\n")
		return
	}
	w.BulkString(s)
}
