package gateway

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/shoenig/test/must"
)

// rawEngine answers every request on a connection with answer(n), n
// counting the engine's connections from 1, written as raw bytes; close
// says whether to close the connection after it.
func rawEngine(t *testing.T, answer func(conn int) (resp string, close bool)) (addr string, conns *atomic.Int64) {
	t.Helper()
	return rawEngineEach(t, func(conn, _ int) (string, bool) { return answer(conn) })
}

// rawEngineEach is rawEngine with answer also told the request's number on
// its connection (from 0); an empty answer closes the connection unanswered.
func rawEngineEach(t *testing.T, answer func(conn, req int) (resp string, close bool)) (addr string, conns *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	conns = &atomic.Int64{}
	// The engine's connections close with the test: the gateway keeps idle
	// upstream connections, and their read and write loops outlive the test
	// (goleak, TestMain) while the engine holds its end open. A connection
	// Accept returns while the test ends is closed too (it was not yet in
	// open when the cleanup closed those), and the cleanup returns once
	// every goroutine of the engine has.
	var (
		mu     sync.Mutex
		open   = map[net.Conn]struct{}{}
		closed bool
		wg     sync.WaitGroup
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		closed = true
		for c := range open {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			if closed {
				mu.Unlock()
				c.Close()
				continue
			}
			open[c] = struct{}{}
			wg.Add(1)
			mu.Unlock()
			n := int(conns.Add(1))
			go func() {
				defer wg.Done()
				defer c.Close()
				br := bufio.NewReader(c)
				for i := 0; ; i++ {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					resp, closeAfter := answer(n, i)
					if resp == "" {
						return
					}
					if _, err := io.WriteString(c, resp); err != nil || closeAfter {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), conns
}

func chunk(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

const sseHead = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

func TestStreamRelaysChunksAndReusesConnection(t *testing.T) {
	// Chunk extensions and a trailer are dropped; the data goes through.
	a, conns := rawEngine(t, func(int) (string, bool) {
		return sseHead + "f;x=1\r\ndata: {\"i\":0}\n\n\r\n" +
			chunk("data: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}\n\n") +
			chunk("data: [DONE]\n\n") + "0\r\nX-Trailer: 1\r\n\r\n", false
	})
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + a})
	for range 3 {
		resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.NoError(t, err)
		must.Eq(t, "data: {\"i\":0}\n\ndata: {\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n", string(b))
	}
	must.Eq(t, int64(1), conns.Load())
	testutil.Eventually(t, 5*time.Second, "the usage to be counted", func() bool { return promtest.ToFloat64(h.m.Tokens.WithLabelValues("m", "a", "completion")) == 3 })
}

func TestStreamBytesAfterBodyDropConnection(t *testing.T) {
	// An engine that sends more than one response's worth is not trusted
	// with the next request.
	a, conns := rawEngine(t, func(int) (string, bool) {
		return sseHead + "5\r\nhello\r\n0\r\n\r\nHTTP/1.1 200 OK\r\n", false
	})
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + a})
	for range 2 {
		resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.NoError(t, err)
		must.Eq(t, "hello", string(b))
	}
	must.Eq(t, int64(2), conns.Load())
}

func TestStreamBrokenFramingOrCloseEndsWithErrorEvent(t *testing.T) {
	for name, tail := range map[string]string{
		"bad size line":           "zz\r\nmore\r\n",
		"data without CRLF":       "3\r\nabcXY",
		"close inside a chunk":    "9\r\nabc",
		"close before last chunk": "",
	} {
		t.Run(name, func(t *testing.T) {
			// The engine writes its last bytes and closes at once: the FIN
			// comes with them and must still end the stream.
			a, _ := rawEngine(t, func(int) (string, bool) {
				return sseHead + chunk("data: {\"i\":0}\n\n") + tail, true
			})
			h := newHarness(t, nil, nil, map[string]string{"a": "m@" + a})
			done := make(chan struct{})
			var b []byte
			var err error
			go func() {
				defer close(done)
				resp := h.post("/v1/chat/completions", `{"model":"m","stream":true}`)
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
			}()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("the broken stream did not end")
			}
			must.NoError(t, err) // a proper end, after an error event
			must.True(t, strings.HasPrefix(string(b), "data: {\"i\":0}\n\n"))
			must.Eq(t, "upstream_error", errorEventCode(t, string(b)))
			testutil.Eventually(t, 5*time.Second, "the request to be counted", func() bool { return promtest.ToFloat64(h.m.Requests.WithLabelValues("m", "502", "a")) == 1 })
		})
	}
}

func TestResponseHopHeadersDropped(t *testing.T) {
	// Connection-level fields in the engine's response head never reach the
	// client; end-to-end ones do, and a head without any is passed as it is.
	a, _ := rawEngine(t, func(conn int) (string, bool) {
		if conn%2 == 1 {
			return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nKeep-Alive: timeout=5\r\n" +
				"Proxy-Authenticate: Basic\r\nUpgrade: h2c\r\nX-Kept: 1\r\nContent-Length: 2\r\n\r\n{}", true
		}
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Kept: 2\r\nContent-Length: 2\r\n\r\n{}", true
	})
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + a})
	for i := 1; i <= 2; i++ {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.NoError(t, err)
		must.Eq(t, "{}", string(b))
		must.Eq(t, strconv.Itoa(i), resp.Header.Get("X-Kept"))
		must.Eq(t, "application/json", resp.Header.Get("Content-Type"))
		must.NotEq(t, "", resp.Header.Get("X-Request-Id"))
		for _, k := range []string{"Keep-Alive", "Proxy-Authenticate", "Upgrade"} {
			must.SliceEmpty(t, resp.Header.Values(k), must.Sprint(k))
		}
	}
}

func TestInterimResponsesSkipped(t *testing.T) {
	// The engine's 1xx responses are read into the same per-request state
	// as the final one: none of their fields may leak into it.
	a, _ := rawEngine(t, func(int) (string, bool) {
		return "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>; rel=preload\r\nX-Early: 1\r\n\r\n" +
			"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Final: 1\r\nContent-Length: 2\r\n\r\n{}", false
	})
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + a})
	for range 2 {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.NoError(t, err)
		must.Eq(t, 200, resp.StatusCode)
		must.Eq(t, "{}", string(b))
		must.Eq(t, "1", resp.Header.Get("X-Final"))
		must.Eq(t, "", resp.Header.Get("X-Early"))
		must.Eq(t, "", resp.Header.Get("Link"))
	}
}

// An engine that closes a kept-alive connection just as the next request
// arrives on it (its keep-alive timeout firing then) costs nothing: the
// transport resends the request on a new connection, with no gateway retry.
func TestStaleKeepAliveConnectionResent(t *testing.T) {
	var served, dropped atomic.Int64
	a, _ := rawEngineEach(t, func(_, req int) (string, bool) {
		if req == 1 { // the second request on a connection: close unanswered
			dropped.Add(1)
			return "", true
		}
		served.Add(1)
		return "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}", false
	})
	h := newHarness(t, nil, nil, map[string]string{"a": "m@" + a})
	for range 6 {
		resp := h.post("/v1/chat/completions", `{"model":"m"}`)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.NoError(t, err)
		must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(string(b)))
	}
	must.Eq(t, int64(6), served.Load())
	must.Eq(t, int64(5), dropped.Load()) // every request after the first met a stale connection first
	must.Eq(t, 0.0, promtest.ToFloat64(h.m.Retries.WithLabelValues("m")))
}
