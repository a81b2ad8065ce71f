package gateway

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestTransportReusesConnections(t *testing.T) {
	var conns atomic.Int64
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: %s\n\n", b)
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	s.Start()
	defer s.Close()
	tr := NewTransport(time.Second)
	for i := range 20 {
		req, _ := http.NewRequest(http.MethodPost, s.URL+"/x", bytes.NewReader([]byte(fmt.Sprint(i))))
		resp, err := tr.RoundTrip(req)
		must.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		must.NoError(t, err)
		resp.Body.Close()
		must.Eq(t, fmt.Sprintf("data: %d\n\ndata: [DONE]\n\n", i), string(b))
	}
	must.Eq(t, int64(1), conns.Load())

	// The engine closing idle connections costs nothing: a fresh one is dialled.
	s.CloseClientConnections()
	time.Sleep(10 * time.Millisecond)
	req, _ := http.NewRequest(http.MethodPost, s.URL+"/x", bytes.NewReader([]byte("again")))
	resp, err := tr.RoundTrip(req)
	must.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.StrContains(t, string(b), "again")
	must.Eq(t, int64(2), conns.Load())
}

func TestTransportUnfinishedBodyClosesConn(t *testing.T) {
	release := make(chan struct{})
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer s.Close()
	defer close(release)
	tr := NewTransport(time.Second)
	req, _ := http.NewRequest(http.MethodPost, s.URL, bytes.NewReader(nil))
	resp, err := tr.RoundTrip(req)
	must.NoError(t, err)
	buf := make([]byte, 64)
	_, err = resp.Body.Read(buf)
	must.NoError(t, err)
	done := make(chan struct{})
	go func() { resp.Body.Close(); close(done) }()
	select {
	case <-done: // returns at once, never drains a live stream
	case <-time.After(2 * time.Second):
		t.Fatal("Close blocked on an unfinished stream")
	}
	tr.mu.Lock()
	must.Eq(t, 0, len(tr.idle[req.URL.Host]))
	tr.mu.Unlock()
}

func TestTransportCancel(t *testing.T) {
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
	}))
	defer s.Close()
	tr := NewTransport(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL, bytes.NewReader(nil))
	start := time.Now()
	_, err := tr.RoundTrip(req)
	must.ErrorIs(t, err, context.DeadlineExceeded)
	must.Less(t, 2*time.Second, time.Since(start))
}

// A head that arrives in pieces, with waits between them (bare LF line ends
// in one), is read whole before it is parsed; a large head fills the read
// buffer and goes to net/http; interim (1xx) responses are skipped.
func TestTransportReadsHeads(t *testing.T) {
	big := strings.Repeat("x", 9000)
	for _, pieces := range [][]string{
		{"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"},
		{"HTTP/1.1 200 OK\r\nContent-", "Length: 2\r\n\r", "\nok"},
		{"HTTP/1.1 200 OK\n", "Content-Length: 2\n", "\n", "ok"},
		{"HTTP/1.1 200 OK\r\nX-Big: " + big[:4000], big[4000:] + "\r\nContent-Length: 2\r\n\r\nok"},
	} {
		req, _ := http.NewRequest(http.MethodPost, scriptedEngine(t, 20*time.Millisecond, pieces...), bytes.NewReader([]byte("{}")))
		resp, err := NewTransport(time.Second).RoundTrip(req)
		must.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.Eq(t, 200, resp.StatusCode)
		must.Eq(t, "ok", string(b))
	}
}

// An engine that closes after part of a head: an error, never a response.
func TestTransportPartialHeadFails(t *testing.T) {
	req, _ := http.NewRequest(http.MethodPost, scriptedEngine(t, 20*time.Millisecond, "HTTP/1.1 200 OK\r\nContent-Le"), bytes.NewReader([]byte("{}")))
	_, err := NewTransport(time.Second).RoundTrip(req)
	must.ErrorContains(t, err, "malformed MIME header") // net/http's verdict, as before
}

// scriptedEngine accepts one connection, reads the request, writes pieces
// with gap after each and closes; it returns the URL to post to.
func scriptedEngine(t *testing.T, gap time.Duration, pieces ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	t.Cleanup(func() { ln.Close() })
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		for _, p := range pieces {
			_, _ = io.WriteString(c, p)
			time.Sleep(gap)
		}
	}()
	return "http://" + ln.Addr().String() + "/"
}

func TestWriteRequestRoundTrips(t *testing.T) {
	body := `{"model":"m","stream":true}`
	newPost := func() *http.Request {
		post, err := http.NewRequest(http.MethodPost, "http://10.0.0.1:8000/v1/chat/completions?x=1&y=%20", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		post.Header.Set("Content-Type", "application/json")
		post.Header["X-Multi"] = []string{"a", "b"}
		post.Header.Set("Content-Length", "999") // stale: the request's field wins
		return post
	}
	get, _ := http.NewRequest(http.MethodGet, "http://engine/metrics", nil)
	get.Header.Set("User-Agent", "oasis-router")
	closing, _ := http.NewRequest(http.MethodGet, "http://engine/health", nil)
	closing.Close = true

	for _, tc := range []struct {
		req  *http.Request
		body string
		ua   string
		size int // of the writer's buffer: the head fits it, or not
	}{{newPost(), body, "Go-http-client/1.1", 4096}, {get, "", "oasis-router", 4096}, {closing, "", "Go-http-client/1.1", 4096},
		{newPost(), body, "Go-http-client/1.1", 16}, {get, "", "oasis-router", 16}} {
		var buf bytes.Buffer
		w := bufio.NewWriterSize(&buf, tc.size)
		if err := writeRequest(w, tc.req); err != nil {
			t.Fatal(err)
		}
		_ = w.Flush()
		got, err := http.ReadRequest(bufio.NewReader(&buf))
		if err != nil {
			t.Fatalf("%s %s: written request does not parse: %v\n%s", tc.req.Method, tc.req.URL, err, buf.String())
		}
		b, _ := io.ReadAll(got.Body)
		if got.Method != tc.req.Method || got.RequestURI != tc.req.URL.RequestURI() || got.Host != tc.req.URL.Host ||
			string(b) != tc.body || got.ContentLength != int64(len(tc.body)) && tc.body != "" || got.UserAgent() != tc.ua ||
			got.Close != tc.req.Close {
			t.Fatalf("round trip changed the request: %+v body %q", got, b)
		}
		for k, vs := range tc.req.Header {
			if k == "Content-Length" {
				continue
			}
			if !slices.Equal(got.Header[k], vs) {
				t.Fatalf("header %s: got %q, want %q", k, got.Header[k], vs)
			}
		}
		if buf.Len() != 0 {
			t.Fatalf("%d bytes left after the request", buf.Len())
		}
	}
}

func TestWriteRequestRejectsHeaderInjection(t *testing.T) {
	for _, h := range []http.Header{{"X-Evil": {"a\r\nInjected: 1"}}, {"Bad Key": {"v"}},
		// A bad field among good ones, before or after them (map order):
		// the good ones already built must not be written twice.
		{"A": {"1"}, "B": {"2"}, "X-Evil": {"ok", "a\nInjected: 1"}, "C": {"3"}}} {
		req, _ := http.NewRequest(http.MethodPost, "http://engine/v1/completions", strings.NewReader("{}"))
		req.Header = h
		var buf bytes.Buffer
		w := bufio.NewWriter(&buf)
		if err := writeRequest(w, req); err != nil {
			continue // refused: fine
		}
		// net/http's writer, the fallback, turns CR/LF into spaces: also fine,
		// as long as no header line was injected.
		_ = w.Flush()
		got, err := http.ReadRequest(bufio.NewReader(&buf))
		if err != nil {
			t.Fatalf("header %q: written request does not parse: %v", h, err)
		}
		if _, ok := got.Header["Injected"]; ok || len(got.Header) > 3+len(h) {
			t.Fatalf("header %q injected a header: %q", h, got.Header)
		}
	}
}

// A CR, LF or NUL anywhere in what writeRequest would write, or in a field
// it leaves out, sends the request to net/http's writer with nothing of its
// own written: the output is exactly req.Write's.
func TestWriteRequestFallsBackOnBadParts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*http.Request)
	}{
		{"LF in value", func(r *http.Request) { r.Header["X-A"] = []string{"ok", "a\nInjected: 1"} }},
		{"CRLF in value", func(r *http.Request) { r.Header["X-A"] = []string{"a\r\nInjected: 1"} }},
		{"lone CR in value", func(r *http.Request) { r.Header["X-A"] = []string{"a\rb"} }},
		{"NUL in value", func(r *http.Request) { r.Header["X-A"] = []string{"a\x00b"} }},
		{"CRLF in left-out field", func(r *http.Request) { r.Header["Content-Length"] = []string{"2\r\nInjected: 1"} }},
		{"CRLF in host", func(r *http.Request) { r.Host = "engine\r\nInjected: 1" }},
		{"NUL in host", func(r *http.Request) { r.Host = "engine\x00" }},
		{"CRLF in method", func(r *http.Request) { r.Method = "POST\r\nInjected: 1" }},
		{"space in method", func(r *http.Request) { r.Method = "PO ST" }},
		{"bad name", func(r *http.Request) { r.Header["Bad Key"] = []string{"v"} }},
	} {
		write := func(own bool) (string, error) {
			req, _ := http.NewRequest(http.MethodPost, "http://engine/v1/completions", strings.NewReader("{}"))
			req.Header["Content-Type"] = []string{"application/json"}
			req.Header["X-B"] = []string{"fine"}
			tc.change(req)
			var buf bytes.Buffer
			w := bufio.NewWriter(&buf)
			var err error
			if own {
				err = writeRequest(w, req)
			} else {
				err = req.Write(w)
			}
			_ = w.Flush()
			return buf.String(), err
		}
		got, gerr := write(true)
		want, werr := write(false)
		if got != want || (gerr == nil) != (werr == nil) {
			t.Errorf("%s: writeRequest wrote %q (%v), net/http %q (%v)", tc.name, got, gerr, want, werr)
		}
	}
}
