package gateway

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
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

func TestTransportSkipsInterimResponses(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		buf := make([]byte, 4096)
		_, _ = c.Read(buf)
		_, _ = io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"+
			"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
	}()
	req, _ := http.NewRequest(http.MethodPost, "http://"+ln.Addr().String()+"/", bytes.NewReader([]byte("{}")))
	resp, err := NewTransport(time.Second).RoundTrip(req)
	must.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	must.Eq(t, "ok", string(b))
}
