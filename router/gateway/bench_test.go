package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
)

// BenchmarkProxyStreaming measures the router's per-request cost for a short
// streaming completion against an in-process engine (engine cost included;
// compare with BenchmarkDirectStreaming for the router's share).
func BenchmarkProxyStreaming(b *testing.B) {
	e := sseEngine()
	defer e.Close()
	h := newHarness(&testing.T{}, nil, nil, map[string]string{"a": "m@" + addr(e)})
	benchStream(b, h.srv.URL)
}

func BenchmarkDirectStreaming(b *testing.B) {
	e := sseEngine()
	defer e.Close()
	benchStream(b, e.URL)
}

func sseEngine() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 4 {
			fmt.Fprintf(w, "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"tok%d\"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
}

func benchStream(b *testing.B, url string) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	body := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":4,"stream":true}`
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

func BenchmarkParseResponseHead(b *testing.B) {
	head := []byte("HTTP/1.1 200 OK\r\nCache-Control: no-cache\r\nContent-Type: text/event-stream; charset=utf-8\r\n" +
		"X-Request-Id: 0123456789abcdef01234567\r\nDate: Sat, 21 Nov 2026 07:04:31 GMT\r\nTransfer-Encoding: chunked\r\n\r\n")
	b.ReportAllocs()
	for b.Loop() {
		if _, ok := parseResponseHead(head); !ok {
			b.Fatal("not parsed")
		}
	}
}

// BenchmarkWriteRequest writes a gateway-style upstream request: the
// client's header (as the h1 server parsed it) plus X-Request-Id.
func BenchmarkWriteRequest(b *testing.B) {
	body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"stream":true}`)
	req, _ := http.NewRequest(http.MethodPost, "http://127.0.0.1:8000/v1/chat/completions", nil)
	req.Header = http.Header{
		"Content-Type":   {"application/json"},
		"Accept":         {"text/event-stream"},
		"User-Agent":     {"Go-http-client/1.1"},
		"Content-Length": {strconv.Itoa(len(body))},
		"Authorization":  {"Bearer sk-0123456789abcdef0123456789abcdef"},
		"X-Request-Id":   {"0123456789abcdef01234567"},
	}
	req.ContentLength = int64(len(body))
	var rb reqBody
	req.Body = &rb
	w := bufio.NewWriterSize(io.Discard, 4<<10)
	b.ReportAllocs()
	for b.Loop() {
		rb.Reset(body)
		if err := writeRequest(w, req); err != nil {
			b.Fatal(err)
		}
		w.Reset(io.Discard)
	}
}
