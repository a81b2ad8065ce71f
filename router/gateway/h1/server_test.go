package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// start serves h on a loopback port and returns the server and its address.
func start(t *testing.T, h http.Handler, tune ...func(*Server)) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	s := &Server{Handler: h, workerMode: testWorkerMode}
	for _, f := range tune {
		f(s)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		must.ErrorIs(t, <-served, http.ErrServerClosed)
	})
	return s, ln.Addr().String()
}

// testWorkerMode runs the tests on the portable connections (a worker
// goroutine per connection waiting on the socket) instead of the Linux
// hangup watcher (TestWorkerMode).
var testWorkerMode bool

func TestWorkerMode(t *testing.T) {
	testWorkerMode = true
	defer func() { testWorkerMode = false }()
	for name, f := range map[string]func(*testing.T){
		"KeepAliveAndPipelining":         TestKeepAliveAndPipelining,
		"ClientDisconnectCancelsContext": TestClientDisconnectCancelsContext,
		"HalfCloseAfterPipelining":       TestHalfCloseAfterPipelining,
		"AbortHandlerCutsResponse":       TestAbortHandlerCutsResponse,
		"UnreadBody":                     TestUnreadBody,
		"ShutdownDrainsStreams":          TestShutdownDrainsStreams,
		"ExpectContinue":                 TestExpectContinue,
		"StreamingFlushesAndChunks":      TestStreamingFlushesAndChunks,
		"RequestArrivingDuringHandler":   TestRequestArrivingDuringHandlerIsServed,
		"SplitRequestsOnKeepAlive":       TestSplitRequestsOnKeepAlive,
		"CloseWithHandlerRunning":        TestCloseWithHandlerRunning,
	} {
		t.Run(name, f)
	}
}

func TestHangupWatcherIsUsedOnLinux(t *testing.T) {
	if testWorkerMode || runtime.GOOS != "linux" {
		t.Skip("Linux only")
	}
	watched := make(chan bool, 1)
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		watched <- w.(*response).cn.watched
	}))
	c := dial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	c.read("GET")
	must.True(t, <-watched)
}

// rawConn sends bytes and reads responses on one connection.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (r *rawConn) send(s string) {
	r.t.Helper()
	_, err := io.WriteString(r.c, s)
	must.NoError(r.t, err)
}

func (r *rawConn) read(method string) (*http.Response, string) {
	r.t.Helper()
	resp, err := http.ReadResponse(r.br, &http.Request{Method: method})
	must.NoError(r.t, err)
	b, err := io.ReadAll(resp.Body)
	must.NoError(r.t, err)
	return resp, string(b)
}

// closed reports whether the server closed the connection.
func (r *rawConn) closed() bool {
	_, err := r.br.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.ErrUnexpectedEOF) ||
		err != nil && strings.Contains(err.Error(), "reset")
}

func echo() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		if err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		fmt.Fprintf(w, "%s %s host=%s len=%d body=%s x=%s", r.Method, r.URL.Path, r.Host, r.ContentLength, b, r.Header.Get("X-Test"))
	})
}

func TestKeepAliveAndPipelining(t *testing.T) {
	_, addr := start(t, echo())
	c := dial(t, addr)
	// Three requests in one write: answered in order on one connection.
	c.send("GET /a HTTP/1.1\r\nHost: h\r\nX-Test: 1\r\n\r\n" +
		"POST /b HTTP/1.1\r\nHost: h\r\ncontent-length: 5\r\n\r\nhello" +
		"POST /c?q=1 HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\nTrailer-X: y\r\n\r\n")
	resp, body := c.read("GET")
	must.EqOp(t, 200, resp.StatusCode)
	must.EqOp(t, "GET /a host=h len=0 body= x=1", body)
	must.EqOp(t, int64(len(body)), resp.ContentLength)
	_, body = c.read("POST")
	must.EqOp(t, "POST /b host=h len=5 body=hello x=", body)
	_, body = c.read("POST")
	must.EqOp(t, "POST /c host=h len=-1 body=abcde x=", body)
	// Still open for more.
	c.send("GET /d HTTP/1.1\r\nHost: h\r\n\r\n")
	_, body = c.read("GET")
	must.StrHasPrefix(t, "GET /d", body)
}

func TestConnectionClose(t *testing.T) {
	_, addr := start(t, echo())
	c := dial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
	resp, _ := c.read("GET")
	must.True(t, resp.Close)
	must.True(t, c.closed())

	c = dial(t, addr)
	c.send("GET / HTTP/1.0\r\n\r\n")
	resp, body := c.read("GET")
	must.True(t, resp.Close)
	must.StrHasPrefix(t, "GET / host= ", body)
	must.True(t, c.closed())
}

func TestStreamingFlushesAndChunks(t *testing.T) {
	release := make(chan struct{})
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for i := 0; i < 3; i++ {
			fmt.Fprintf(w, "data: %d\n\n", i)
			must.NoError(t, http.NewResponseController(w).Flush())
		}
		<-release
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	resp, err := http.Post("http://"+addr+"/", "application/json", strings.NewReader("{}"))
	must.NoError(t, err)
	defer resp.Body.Close()
	must.Eq(t, []string{"chunked"}, resp.TransferEncoding)
	br := bufio.NewReader(resp.Body)
	// All three events arrive while the handler still runs.
	for i := 0; i < 3; i++ {
		line, err := br.ReadString('\n')
		must.NoError(t, err)
		must.EqOp(t, fmt.Sprintf("data: %d\n", i), line)
		_, _ = br.ReadString('\n')
	}
	close(release)
	rest, err := io.ReadAll(br)
	must.NoError(t, err)
	must.EqOp(t, "data: [DONE]\n\n", string(rest))
}

func TestLargeResponseIsChunked(t *testing.T) {
	big := strings.Repeat("x", 3*pendingMax)
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, big)
	}))
	resp, err := http.Get("http://" + addr + "/")
	must.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.NoError(t, err)
	must.EqOp(t, big, string(b))
	must.Eq(t, []string{"chunked"}, resp.TransferEncoding)
	must.EqOp(t, "text/plain; charset=utf-8", resp.Header.Get("Content-Type")) // sniffed
	must.NotEq(t, "", resp.Header.Get("Date"))
}

func TestHeadAndNoContent(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/204" {
			w.WriteHeader(http.StatusNoContent)
			_, err := w.Write([]byte("x"))
			must.ErrorIs(t, err, http.ErrBodyNotAllowed)
			return
		}
		_, _ = io.WriteString(w, "hello")
	}))
	c := dial(t, addr)
	c.send("HEAD / HTTP/1.1\r\nHost: h\r\n\r\nGET /204 HTTP/1.1\r\nHost: h\r\n\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := c.read("HEAD")
	must.EqOp(t, 200, resp.StatusCode)
	must.EqOp(t, "", body)
	must.EqOp(t, int64(5), resp.ContentLength)
	resp, body = c.read("GET")
	must.EqOp(t, 204, resp.StatusCode)
	must.EqOp(t, "", body)
	_, body = c.read("GET")
	must.EqOp(t, "hello", body)
}

func TestExpectContinue(t *testing.T) {
	_, addr := start(t, echo())
	tr := &http.Transport{ExpectContinueTimeout: 10 * time.Second}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/e", strings.NewReader("payload"))
	must.NoError(t, err)
	req.Header.Set("Expect", "100-continue")
	start := time.Now()
	resp, err := (&http.Client{Transport: tr}).Do(req)
	must.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.EqOp(t, "POST /e host="+addr+" len=7 body=payload x=", string(b))
	// Without a 100 Continue the client would have waited its 10 s.
	must.Less(t, 5*time.Second, time.Since(start))
}

func TestExpectContinueUnreadBodyCloses(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusUnauthorized) // refused before reading the body
	}))
	c := dial(t, addr)
	c.send("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
	resp, _ := c.read("POST")
	must.EqOp(t, http.StatusUnauthorized, resp.StatusCode)
	must.True(t, resp.Close) // the body never comes: the connection cannot be reused
	must.True(t, c.closed())
}

func TestProtocolErrors(t *testing.T) {
	for _, tc := range []struct {
		name, req string
		status    int
	}{
		{"malformed request line", "GARBAGE\r\n\r\n", 400},
		{"bad method", "G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400},
		{"no host", "GET / HTTP/1.1\r\n\r\n", 400},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400},
		{"space before colon", "GET / HTTP/1.1\r\nHost: h\r\nX-A : b\r\n\r\n", 400},
		{"folded line", "GET / HTTP/1.1\r\nHost: h\r\nX-A: b\r\n c\r\n\r\n", 400},
		{"control in value", "GET / HTTP/1.1\r\nHost: h\r\nX-A: b\x01c\r\n\r\n", 400},
		{"length and chunked", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400},
		{"two lengths", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd", 400},
		{"negative length", "POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n", 400},
		{"gzip coding", "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
		{"http/2", "GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505},
		{"expect other", "POST / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\nContent-Length: 1\r\n\r\nx", 417},
		{"header too large", "GET / HTTP/1.1\r\nHost: h\r\nX-Big: " + strings.Repeat("a", 9000) + "\r\n\r\n", 431},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var called atomic.Bool
			_, addr := start(t, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) }),
				func(s *Server) {
					s.MaxHeaderBytes = 8 << 10
					s.ProtocolError = func(w http.ResponseWriter, status int, msg string) {
						w.Header().Set("Content-Type", "application/json")
						w.WriteHeader(status)
						fmt.Fprintf(w, `{"error":{"message":%q}}`, msg)
					}
				})
			c := dial(t, addr)
			c.send(tc.req)
			resp, body := c.read("GET")
			must.EqOp(t, tc.status, resp.StatusCode)
			must.StrHasPrefix(t, `{"error":{"message":`, body)
			must.True(t, resp.Close)
			must.True(t, c.closed())
			must.False(t, called.Load())
		})
	}
}

func TestClientDisconnectCancelsContext(t *testing.T) {
	cancelled := make(chan struct{})
	started := make(chan struct{})
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body)
		close(started)
		select {
		case <-r.Context().Done():
			close(cancelled)
		case <-time.After(10 * time.Second):
		}
	}))
	c := dial(t, addr)
	c.send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}")
	<-started
	c.c.Close()
	select {
	case <-cancelled:
	case <-time.After(5 * time.Second):
		t.Fatal("the request's context was not cancelled when the client left")
	}
}

func TestHalfCloseAfterPipelining(t *testing.T) {
	// Requests sent before the client's FIN are still answered: only a
	// hangup with nothing unread cancels the running request.
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
			w.WriteHeader(http.StatusTeapot)
		case <-time.After(50 * time.Millisecond):
			fmt.Fprint(w, r.URL.Path)
		}
	}))
	c := dial(t, addr)
	c.send("GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /b HTTP/1.1\r\nHost: h\r\n\r\n")
	must.NoError(t, c.c.(*net.TCPConn).CloseWrite())
	resp, body := c.read("GET")
	must.EqOp(t, 200, resp.StatusCode)
	must.EqOp(t, "/a", body)
	// The last one, with nothing after it, sees the hangup (as net/http's
	// server, which cancels on the EOF of its background read).
	resp, _ = c.read("GET")
	must.EqOp(t, http.StatusTeapot, resp.StatusCode)
}

func TestAbortHandlerCutsResponse(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}))
	resp, err := http.Get("http://" + addr + "/")
	must.NoError(t, err)
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.EqOp(t, "data: 1\n\n", string(b))
	must.ErrorIs(t, err, io.ErrUnexpectedEOF)
}

func TestPanicClosesConnection(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		panic("boom")
	}))
	c := dial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	must.True(t, c.closed())
}

func TestUnreadBody(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "ignored your body")
	}))
	c := dial(t, addr)
	// A small unread body is dropped and the connection kept.
	c.send("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123456789GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ := c.read("POST")
	must.False(t, resp.Close)
	_, body := c.read("GET")
	must.EqOp(t, "ignored your body", body)
	// A large one that has not arrived closes the connection.
	c.send(fmt.Sprintf("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: %d\r\n\r\nabc", maxDiscard+100))
	resp, _ = c.read("POST")
	must.True(t, resp.Close)
	must.True(t, c.closed())
}

func TestShutdownDrainsStreams(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{}, 1)
	s, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/quick" {
			return
		}
		fmt.Fprint(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		inHandler <- struct{}{}
		<-release
		fmt.Fprint(w, "data: 2\n\n")
	}))
	idle := dial(t, addr)
	idle.send("GET /quick HTTP/1.1\r\nHost: h\r\n\r\n")
	idle.read("GET")

	stream := dial(t, addr)
	stream.send("GET /stream HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, err := http.ReadResponse(stream.br, nil)
	must.NoError(t, err)
	<-inHandler

	shut := make(chan error, 1)
	go func() { shut <- s.Shutdown(context.Background()) }()
	must.True(t, idle.closed()) // idle keep-alive connections go at once
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		_, err := net.Dial("tcp", addr)
		return err != nil
	}), wait.Timeout(5*time.Second)))
	select {
	case err := <-shut:
		t.Fatalf("Shutdown returned %v with a stream in flight", err)
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	must.EqOp(t, "data: 1\n\ndata: 2\n\n", string(b))
	must.True(t, stream.closed()) // and the connection ends after it
	must.NoError(t, <-shut)
}

func TestShutdownTimesOut(t *testing.T) {
	release := make(chan struct{})
	defer close(release)
	inHandler := make(chan struct{})
	s, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inHandler)
		<-release
	}))
	c := dial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	<-inHandler
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	must.ErrorIs(t, s.Shutdown(ctx), context.DeadlineExceeded)
}

func TestIdleTimeoutClosesConnection(t *testing.T) {
	_, addr := start(t, echo(), func(s *Server) { s.IdleTimeout = 50 * time.Millisecond })
	c := dial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	c.read("GET")
	must.True(t, c.closed()) // within the sweeper's period, before dial's 10 s deadline
}

func TestHeaderTimeoutClosesConnection(t *testing.T) {
	_, addr := start(t, echo(), func(s *Server) { s.ReadHeaderTimeout = 50 * time.Millisecond })
	c := dial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: h\r\n") // never finished
	must.True(t, c.closed())
}

func TestSetHeader(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hs := w.(interface{ SetHeader(http.Header) bool })
		if r.URL.Path == "/set" {
			if !hs.SetHeader(http.Header{"X-Handed": {"over"}}) {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
		} else {
			w.Header().Set("X-Own", "1") // a header already set is not replaced
			if hs.SetHeader(http.Header{"X-Handed": {"over"}}) {
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
		}
		_, _ = io.WriteString(w, "ok")
		if hs.SetHeader(http.Header{"X-Late": {"1"}}) { // too late: written
			panic("SetHeader after a write took the map")
		}
	}))
	c := dial(t, addr)
	c.send("GET /set HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := c.read("GET")
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, "ok", body)
	must.Eq(t, "over", resp.Header.Get("X-Handed"))
	c.send("GET /own HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ = c.read("GET")
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, "1", resp.Header.Get("X-Own"))
	must.Eq(t, "", resp.Header.Get("X-Handed"))
}

func TestResponseHeadersTheServerManages(t *testing.T) {
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-A", "1")
		h.Set("Keep-Alive", "timeout=5") // hop-by-hop: dropped
		h.Set("X-Bad", "a\r\nInjected: yes")
		h["X-Cr"] = []string{"a\rb"}
		h["X-Nul"] = []string{"a\x00b"}
		h["Bad Key"] = []string{"v"}
		switch r.URL.Path {
		case "/nodate":
			h["Date"] = nil // suppressed, as with net/http
		case "/owndate":
			h.Set("Date", "Mon, 02 Jan 2006 15:04:05 GMT")
		case "/close":
			h.Set("Connection", "Keep-Alive, CLOSE")
		}
		_, _ = io.WriteString(w, "ok")
	}))
	c := dial(t, addr)
	c.send("GET /nodate HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ := c.read("GET")
	must.Eq(t, "1", resp.Header.Get("X-A"))
	must.MapNotContainsKey(t, resp.Header, "Date")
	must.MapNotContainsKey(t, resp.Header, "Keep-Alive")
	must.MapNotContainsKey(t, resp.Header, "X-Bad")
	must.MapNotContainsKey(t, resp.Header, "Injected")
	must.MapNotContainsKey(t, resp.Header, "X-Cr")
	must.MapNotContainsKey(t, resp.Header, "X-Nul")
	must.False(t, resp.Close)
	c.send("GET /owndate HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, _ = c.read("GET")
	must.Eq(t, []string{"Mon, 02 Jan 2006 15:04:05 GMT"}, resp.Header.Values("Date"))
	c.send("GET /close HTTP/1.1\r\nHost: h\r\n\r\n")
	resp, body := c.read("GET")
	must.Eq(t, "ok", body)
	must.True(t, resp.Close)
	must.True(t, c.closed())
}
