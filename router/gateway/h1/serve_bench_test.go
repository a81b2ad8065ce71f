package h1

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// BenchmarkServeKeepAlive is one client's keep-alive requests, each with a
// small JSON body, answered by a small handler: the server's cost per
// request on a connection (client included: compare runs, not numbers).
// cpu-us/op is the process's CPU time per request.
func BenchmarkServeKeepAlive(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	resp := []byte(`{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"}}]}`)
	// The header an engine's response hands over, as the router's proxy does.
	engineHeader := http.Header{"Content-Type": {"application/json"}, "Cache-Control": {"no-cache"},
		"X-Request-Id": {"chatcmpl-0123456789abcdef"}, "Server": {"oasis-sim"}}
	s := &Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.(interface{ SetHeader(http.Header) bool }).SetHeader(engineHeader)
		_, _ = w.Write(resp)
	})}
	go func() { _ = s.Serve(ln) }()
	defer s.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	body := `{"model":"m","messages":[{"role":"user","content":"hello there"}],"max_tokens":4,"stream":false}`
	req := []byte("POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nUser-Agent: Go-http-client/1.1\r\n" +
		"Content-Length: " + itoa(len(body)) + "\r\nContent-Type: application/json\r\nAccept-Encoding: gzip\r\n\r\n" + body)
	buf := make([]byte, 4096)
	// The first response tells how long each one is.
	if _, err := c.Write(req); err != nil {
		b.Fatal(err)
	}
	n, err := c.Read(buf)
	if err != nil || !bytes.HasSuffix(buf[:n], resp) {
		b.Fatalf("response %q: %v", buf[:n], err)
	}
	size := n
	var ru0, ru1 syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	b.ResetTimer()
	for b.Loop() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		for got := 0; got < size; {
			n, err := c.Read(buf[got:])
			if err != nil {
				b.Fatal(err)
			}
			got += n
		}
	}
	b.StopTimer()
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(syscall.TimevalToNsec(ru1.Utime) - syscall.TimevalToNsec(ru0.Utime) +
		syscall.TimevalToNsec(ru1.Stime) - syscall.TimevalToNsec(ru0.Stime))
	b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-us/op")
}

func itoa(n int) string {
	var b []byte
	for {
		b = append([]byte{byte('0' + n%10)}, b...)
		if n /= 10; n == 0 {
			return string(b)
		}
	}
}
