package h1

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// Requests that land in the socket while the previous one is handled, after
// the server's last read of it: on Linux the server then waits without
// reading first, which must still see them (rawsock.Conn.Hold).
func TestRequestArrivingDuringHandlerIsServed(t *testing.T) {
	const conns, requests = 4, 150
	// Per connection: its handler reports each request, then waits.
	var started [conns]chan string
	var gate [conns]chan struct{}
	for k := range conns {
		started[k], gate[k] = make(chan string), make(chan struct{})
	}
	_, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		k, err := strconv.Atoi(strings.Split(r.URL.Path, "/")[1])
		if err != nil || k >= conns {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		select {
		case started[k] <- r.URL.Path:
			<-gate[k]
		case <-r.Context().Done():
		}
		fmt.Fprintf(w, "%s %s", r.URL.Path, b)
	}))
	var wg sync.WaitGroup
	for k := range conns {
		c := dial(t, addr)
		req := func(i int) string {
			if i%2 == 0 {
				return fmt.Sprintf("GET /%d/%d HTTP/1.1\r\nHost: h\r\n\r\n", k, i)
			}
			return fmt.Sprintf("POST /%d/%d HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}", k, i)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _ = io.WriteString(c.c, req(0))
			for i := range requests {
				path := fmt.Sprintf("/%d/%d", k, i)
				select {
				case got := <-started[k]:
					if got != path {
						t.Errorf("handler got %s, want %s", got, path)
					}
				case <-time.After(10 * time.Second):
					t.Errorf("request %s was not served", path)
					return
				}
				// The next request arrives while this one's handler runs
				// (or, for every third, while its response is written).
				if i+1 < requests && i%3 != 2 {
					_, _ = io.WriteString(c.c, req(i+1))
				}
				gate[k] <- struct{}{}
				if i+1 < requests && i%3 == 2 {
					_, _ = io.WriteString(c.c, req(i+1))
				}
				resp, err := http.ReadResponse(c.br, nil)
				if err != nil {
					t.Errorf("request %s: %v", path, err)
					return
				}
				b, _ := io.ReadAll(resp.Body)
				if !strings.HasPrefix(string(b), path+" ") {
					t.Errorf("response %q to %s", b, path)
				}
			}
		}()
	}
	wg.Wait()
}

// Bodies and heads that do not come whole in one read are read the usual
// way, and the connection goes on with the next request.
func TestSplitRequestsOnKeepAlive(t *testing.T) {
	_, addr := start(t, echo())
	c := dial(t, addr)
	pause := func() { time.Sleep(20 * time.Millisecond) } // the server reads what came so far
	// Body after the head.
	c.send("POST /body HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n")
	pause()
	c.send("hello")
	_, body := c.read("POST")
	must.EqOp(t, "POST /body host=h len=5 body=hello x=", body)
	// Head in pieces.
	c.send("GET /pieces HTTP/1.1\r\nHo")
	pause()
	c.send("st: h\r\nX-Test: 2\r\n")
	pause()
	c.send("\r\n")
	_, body = c.read("GET")
	must.EqOp(t, "GET /pieces host=h len=0 body= x=2", body)
	// A head longer than the read buffer, then a chunked body in pieces.
	c.send("GET /long HTTP/1.1\r\nHost: h\r\nX-Long: " + strings.Repeat("y", 6000) + "\r\nX-Test: 3\r\n\r\n")
	_, body = c.read("GET")
	must.EqOp(t, "GET /long host=h len=0 body= x=3", body)
	c.send("POST /chunked HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
	pause()
	c.send("0\r\n\r\n")
	_, body = c.read("POST")
	must.EqOp(t, "POST /chunked host=h len=-1 body=abc x=", body)
	// Bare LF line ends.
	c.send("GET /lf HTTP/1.1\nHost: h\nX-Test: 4\n\n")
	_, body = c.read("GET")
	must.EqOp(t, "GET /lf host=h len=0 body= x=4", body)
	// A bad request after good ones is answered and closes.
	c.send("GET /bad HTTP/1.1\r\nHost: h\r\nBad Header\r\n\r\n")
	resp, _ := c.read("GET")
	must.EqOp(t, http.StatusBadRequest, resp.StatusCode)
	must.True(t, c.closed())
}

// Close returns at once while a handler runs (on Linux, inside its
// connection's Hold, which the socket's real close waits for), and the
// connection ends when the handler returns.
func TestCloseWithHandlerRunning(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{})
	s, addr := start(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(inHandler)
		<-release
		_, _ = io.WriteString(w, "late")
	}))
	c := dial(t, addr)
	c.send("GET / HTTP/1.1\r\nHost: h\r\n\r\n")
	<-inHandler
	closed := make(chan struct{})
	go func() { s.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatal("Close waited for a running handler")
	}
	close(release)
	// The connection ends (after the response, when the handler wrote it
	// before the close took effect), not at dial's deadline.
	_, err := io.ReadAll(c.br)
	must.False(t, errors.Is(err, os.ErrDeadlineExceeded))
}
