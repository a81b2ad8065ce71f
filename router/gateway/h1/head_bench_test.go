package h1

import (
	"bufio"
	"bytes"
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
