package cascade

import (
	"bytes"
	"errors"
	"net/http"
)

// MaxAnswer bounds the buffered small answer; a larger one escalates.
const MaxAnswer = 8 << 20

// ErrAnswerTooLarge is a small answer over MaxAnswer.
var ErrAnswerTooLarge = errors.New("the small model's answer exceeds the cascade's buffer")

// Buffer is the http.ResponseWriter of the buffered small leg.
type Buffer struct {
	h      http.Header
	Status int  // the answer's status (200 until written)
	Over   bool // the answer was over MaxAnswer
	wrote  bool
	buf    bytes.Buffer
}

// NewBuffer returns an empty buffer.
func NewBuffer() *Buffer { return &Buffer{h: http.Header{}, Status: http.StatusOK} }

// Header implements http.ResponseWriter.
func (b *Buffer) Header() http.Header { return b.h }

// WriteHeader implements http.ResponseWriter.
func (b *Buffer) WriteHeader(status int) {
	if !b.wrote {
		b.Status, b.wrote = status, true
	}
}

// Write implements http.ResponseWriter.
func (b *Buffer) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if b.buf.Len()+len(p) > MaxAnswer {
		b.Over = true
		return 0, ErrAnswerTooLarge
	}
	return b.buf.Write(p)
}

// Bytes is the answer's body so far.
func (b *Buffer) Bytes() []byte { return b.buf.Bytes() }
