package h1

import (
	"bufio"
	"bytes"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// FuzzReadHead checks the request parser against net/http's: whatever it
// accepts, net/http must accept with the same meaning (it may reject more:
// it is stricter on purpose), and no input panics it.
func FuzzReadHead(f *testing.F) {
	for _, s := range []string{
		"POST /v1/chat/completions HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}",
		"GET /v1/models?x=1 HTTP/1.1\r\nhost: r:80\r\nAuthorization: Bearer k\r\n\r\n",
		"GET http://example.com/a%20b HTTP/1.1\r\nHost: other\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.0\n\n",
		"GET / HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nx-a: 2\r\nX-Oasis-Deadline-Ms: 5\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
		"OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		h, perr, err := readHead(bufio.NewReaderSize(bytes.NewReader(in), 64), 4<<10)
		if h == nil {
			if perr == nil && err == nil {
				t.Fatal("no head, no error")
			}
			return
		}
		ref, rerr := http.ReadRequest(bufio.NewReader(bytes.NewReader(in)))
		if rerr != nil {
			t.Fatalf("accepted what net/http rejects (%v): %q", rerr, in)
		}
		if h.method != ref.Method || h.target != ref.RequestURI || h.host != ref.Host {
			t.Fatalf("request line: got %q %q host %q, net/http %q %q host %q", h.method, h.target, h.host, ref.Method, ref.RequestURI, ref.Host)
		}
		if h.url.String() != ref.URL.String() || h.url.Path != ref.URL.Path || h.url.RawQuery != ref.URL.RawQuery {
			t.Fatalf("URL: got %#v, net/http %#v", h.url, ref.URL)
		}
		if h.major != ref.ProtoMajor || h.minor != ref.ProtoMinor {
			t.Fatalf("version: got %d.%d, net/http %d.%d", h.major, h.minor, ref.ProtoMajor, ref.ProtoMinor)
		}
		if h.chunked != slices.Contains(ref.TransferEncoding, "chunked") || !h.chunked && h.contentLength != ref.ContentLength {
			t.Fatalf("body framing: got chunked=%v length %d, net/http %v %d", h.chunked, h.contentLength, ref.TransferEncoding, ref.ContentLength)
		}
		for k, vs := range ref.Header {
			if k == "Content-Length" || k == "Transfer-Encoding" {
				continue // normalised by net/http
			}
			if !slices.Equal(vs, h.header[k]) {
				t.Fatalf("header %q: got %q, net/http %q", k, h.header[k], vs)
			}
		}
		for k := range h.header {
			if _, ok := ref.Header[k]; !ok && k != "Content-Length" && k != "Transfer-Encoding" && !strings.EqualFold(k, "host") {
				t.Fatalf("header %q: not in net/http's request", k)
			}
		}
	})
}
