package h1

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"testing"
)

func BenchmarkReadHead(b *testing.B) {
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:31710\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: 92\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n")
	rd := bytes.NewReader(req)
	br := bufio.NewReaderSize(rd, 4096)
	b.ReportAllocs()
	for b.Loop() {
		rd.Reset(req)
		br.Reset(rd)
		if _, perr, err := readHead(br, 1<<20); perr != nil || err != nil {
			b.Fatal(perr, err)
		}
	}
}

// BenchmarkWriteHeaders writes an engine's streaming response header as
// the gateway hands it on (checked: the per-value checking walk).
func BenchmarkWriteHeaders(b *testing.B) {
	h := http.Header{
		"Content-Type":  {"text/event-stream; charset=utf-8"},
		"Cache-Control": {"no-cache"},
		"X-Request-Id":  {"0123456789abcdef01234567"},
		"Date":          {"Sat, 21 Nov 2026 07:04:31 GMT"},
	}
	for _, bc := range []struct {
		name string
		fn   func(*bufio.Writer, http.Header) (bool, bool)
	}{{"batched", writeHeaders}, {"checked", writeHeadersChecked}} {
		b.Run(bc.name, func(b *testing.B) {
			w := bufio.NewWriterSize(io.Discard, 4<<10)
			for b.Loop() {
				bc.fn(w, h)
				w.Reset(io.Discard)
			}
		})
	}
}
