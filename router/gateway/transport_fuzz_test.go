package gateway

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// FuzzParseResponse checks the transport's response reader against
// http.ReadResponse on the same bytes: same status, headers, framing, body
// and position after the body (where the next response would start).
func FuzzParseResponse(f *testing.F) {
	for _, s := range []string{
		"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nNEXT",
		"HTTP/1.1 200 OK\r\ncontent-length: 3\r\nx-request-id: a\r\n\r\nabcNEXT",
		"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\n\r\nNEXT",
		"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nuntil the end",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\nNEXT",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
		"HTTP/1.1 200 OK\r\nX-A: 1\r\nx-b:  2 \r\nX-A: 3\r\nKeep-Alive: timeout=5\r\nContent-Length: 0\r\n\r\n",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("X-Many: v\r\n", maxHeadFields+1) + "Content-Length: 0\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		req := &http.Request{Method: http.MethodPost}
		if _, ok := parseResponseHead(in); !ok {
			return // only what the fast path takes
		}
		br := bufio.NewReaderSize(bytes.NewReader(in), 1<<16)
		got, _, err := readResponse(br, req, nil)
		if err != nil {
			t.Fatalf("fast path failed: %v", err)
		}
		rbr := bufio.NewReaderSize(bytes.NewReader(in), 1<<16)
		want, werr := http.ReadResponse(rbr, req)
		if werr != nil {
			t.Fatalf("parsed what net/http rejects (%v): %q", werr, in)
		}
		if got.StatusCode != want.StatusCode || got.Status != want.Status || got.Close != want.Close ||
			got.ContentLength != want.ContentLength || !slices.Equal(got.TransferEncoding, want.TransferEncoding) {
			t.Fatalf("got %d %q close=%v len=%d te=%v, net/http %d %q close=%v len=%d te=%v", got.StatusCode, got.Status,
				got.Close, got.ContentLength, got.TransferEncoding, want.StatusCode, want.Status, want.Close, want.ContentLength, want.TransferEncoding)
		}
		for k, vs := range want.Header {
			if !slices.Equal(vs, got.Header[k]) {
				t.Fatalf("header %q: got %q, net/http %q", k, got.Header[k], vs)
			}
		}
		if len(got.Header) != len(want.Header) {
			t.Fatalf("headers: got %v, net/http %v", got.Header, want.Header)
		}
		gb, gerr := io.ReadAll(got.Body)
		wb, wberr := io.ReadAll(want.Body)
		if !bytes.Equal(gb, wb) || (gerr == nil) != (wberr == nil) {
			t.Fatalf("body: got %q (%v), net/http %q (%v)", gb, gerr, wb, wberr)
		}
		if gerr == nil && br.Buffered() != rbr.Buffered() {
			t.Fatalf("after the body: %d bytes left, net/http %d", br.Buffered(), rbr.Buffered())
		}
	})
}

func TestReadResponseFields(t *testing.T) {
	// Repeated names keep every value in order; a head with more fields
	// than the fast path takes is read by net/http, with the same result.
	for _, n := range []int{1, maxHeadFields - 3, maxHeadFields - 2, maxHeadFields + 4} {
		in := "HTTP/1.1 200 OK\r\nX-A: first\r\n" + strings.Repeat("X-Many: v\r\n", n) +
			"X-A:  second \r\nContent-Length: 2\r\n\r\nokNEXT"
		br := bufio.NewReader(strings.NewReader(in))
		resp, x, err := readResponse(br, &http.Request{Method: http.MethodPost}, nil)
		must.NoError(t, err)
		must.Eq(t, n+3 <= maxHeadFields, x != nil, must.Sprintf("fast path for %d fields", n+3))
		must.Eq(t, []string{"first", "second"}, resp.Header["X-A"])
		must.Eq(t, n, len(resp.Header["X-Many"]))
		b, err := io.ReadAll(resp.Body)
		must.NoError(t, err)
		must.Eq(t, "ok", string(b))
		rest, _ := io.ReadAll(br)
		must.Eq(t, "NEXT", string(rest))
	}
}
