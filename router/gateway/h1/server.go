// Package h1 is oasis-router's HTTP/1.1 server: a small replacement for
// net/http's server on the router's hot path, serving any http.Handler.
//
// Why: on the router's proxy-bound benchmark net/http's server machinery
// (a background read goroutine and an extra EAGAIN read per request to
// notice client disconnects, per-request deadline timers, header parsing
// through textproto) cost about a third of the router's CPU per request.
// Here one goroutine per connection parses requests. On Linux it runs their
// handlers itself, inside one RawConn.Read of the socket (rawsock.Conn.Hold:
// no read that finds nothing before each idle wait), and one watcher per
// server notices hangups (hangups). Elsewhere, while a request's handler
// runs in the connection's worker goroutine, it waits for the client's next
// bytes: that single wait both notices a disconnect (cancelling the
// request's context) and receives the next keep-alive request. Timeouts are
// enforced by one sweeper per server instead of per-request deadlines.
//
// Supported: HTTP/1.0 and 1.1, keep-alive, pipelined requests (answered in
// order), Content-Length and chunked request bodies, Expect: 100-continue,
// responses with Content-Length (small bodies finished before any flush) or
// chunked (streams, flushed on demand), panics with http.ErrAbortHandler
// cutting the response, graceful Shutdown. Not supported: TLS, HTTP/2,
// Hijack, trailers in responses.
package h1

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/router/gateway/rawsock"
)

// Server serves HTTP/1.1 on listeners.
type Server struct {
	Handler http.Handler

	// ReadHeaderTimeout bounds the time from a request's first byte to the
	// end of its headers (default 10s); IdleTimeout bounds the wait for the
	// next request on a keep-alive connection (default 120s). Both are
	// enforced by a sweeper with about a second of resolution.
	ReadHeaderTimeout time.Duration
	IdleTimeout       time.Duration
	// MaxHeaderBytes bounds the request line plus headers (default 1 MiB).
	MaxHeaderBytes int
	// ProtocolError, when set, writes the response to a request the server
	// rejects before any handler runs (400, 413, 417, 431, 501, 505);
	// default: a plain-text body.
	ProtocolError func(w http.ResponseWriter, status int, msg string)
	Log           hclog.Logger

	mu        sync.Mutex
	listeners map[net.Listener]struct{}
	conns     map[*conn]struct{}
	sweeping  bool
	hangups   *hangups // nil: not Linux, or workerMode
	// workerMode keeps the portable two-goroutine connections (tests).
	workerMode bool
	shutdown   atomic.Bool
	stop       chan struct{} // closed by Shutdown/Close: stops the sweeper
	date       atomic.Pointer[string]
	// clock is the sweeper's time (unix nanoseconds), updated with date:
	// connections stamp their state changes with it instead of reading the
	// clock twice per request; the timeouts have a second's resolution.
	clock   atomic.Int64
	readers sync.Pool // *bufio.Reader, 4 KiB
	writers sync.Pool // *bufio.Writer, 16 KiB
}

// connection states, as the sweeper and Shutdown see them.
const (
	stateIdle   int32 = iota // waiting for a request's first byte
	stateHeader              // reading a request's headers
	stateActive              // a handler runs (or its response is being finished)
	stateClosed
)

// Serve accepts connections on ln until Shutdown or Close; it returns
// http.ErrServerClosed then, or the accept error.
func (s *Server) Serve(ln net.Listener) error {
	if !s.track(ln) {
		ln.Close()
		return http.ErrServerClosed
	}
	defer s.untrack(ln)
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.shutdown.Load() {
				return http.ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || temporary(err) {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				s.logger().Warn("accept failed; retrying", "error", err, "delay", backoff)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		cn := s.newConn(c)
		if cn == nil {
			return http.ErrServerClosed
		}
		go cn.serve()
	}
}

// temporary reports a temporary accept failure (too many open files, a
// connection aborted before accept).
func temporary(err error) bool {
	var t interface{ Temporary() bool }
	return errors.As(err, &t) && t.Temporary()
}

func (s *Server) logger() hclog.Logger {
	if s.Log == nil {
		return hclog.NewNullLogger()
	}
	return s.Log
}

func (s *Server) track(ln net.Listener) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.shutdown.Load() {
		return false
	}
	if s.listeners == nil {
		s.listeners = map[net.Listener]struct{}{}
		s.conns = map[*conn]struct{}{}
		s.stop = make(chan struct{})
	}
	s.listeners[ln] = struct{}{}
	if !s.sweeping {
		s.sweeping = true
		if !s.workerMode {
			if h, err := newHangups(); err == nil {
				s.hangups = h
				go h.run()
			} else {
				s.logger().Debug("client hangups are watched per connection", "reason", err)
			}
		}
		s.updateDate(time.Now())
		go s.sweep(s.stop)
	}
	return true
}

func (s *Server) untrack(ln net.Listener) {
	s.mu.Lock()
	delete(s.listeners, ln)
	s.mu.Unlock()
}

func (s *Server) newConn(c net.Conn) *conn {
	// Raw system calls: no runtime syscall bookkeeping (and no wakeup of
	// the runtime's monitor thread after idle moments) per read and write.
	c = rawsock.Wrap(c)
	cn := &conn{srv: s, c: c, remote: c.RemoteAddr().String()}
	cn.last.Store(time.Now().UnixNano())
	s.mu.Lock()
	defer s.mu.Unlock()
	cn.hangups = s.hangups
	if s.shutdown.Load() {
		c.Close()
		return nil
	}
	s.conns[cn] = struct{}{}
	return cn
}

func (s *Server) forget(cn *conn) {
	s.mu.Lock()
	delete(s.conns, cn)
	s.mu.Unlock()
}

// sweep closes connections past their idle or header timeout and keeps the
// Date header value current.
func (s *Server) sweep(stop chan struct{}) {
	t := time.NewTicker(500 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case now := <-t.C:
			s.updateDate(now)
			idle, header := s.IdleTimeout, s.ReadHeaderTimeout
			if idle <= 0 {
				idle = 120 * time.Second
			}
			if header <= 0 {
				header = 10 * time.Second
			}
			var expired []*conn
			s.mu.Lock()
			for cn := range s.conns {
				age := now.Sub(time.Unix(0, cn.last.Load()))
				switch cn.state.Load() {
				case stateIdle:
					if age > idle {
						expired = append(expired, cn)
					}
				case stateHeader:
					if age > header {
						expired = append(expired, cn)
					}
				}
			}
			s.mu.Unlock()
			for _, cn := range expired {
				cn.closeIfIdle()
			}
		}
	}
}

func (s *Server) updateDate(now time.Time) {
	d := now.UTC().Format(http.TimeFormat)
	s.date.Store(&d)
	s.clock.Store(now.UnixNano())
}

// Shutdown stops accepting, closes idle connections, and waits until every
// in-flight request has finished (connections close after their current
// response) or ctx ends, returning ctx's error then.
func (s *Server) Shutdown(ctx context.Context) error {
	s.closeListeners()
	defer s.closeHangups()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		s.mu.Lock()
		var idle []*conn
		for cn := range s.conns {
			if st := cn.state.Load(); st == stateIdle || st == stateClosed {
				idle = append(idle, cn)
			}
		}
		left := len(s.conns)
		s.mu.Unlock()
		for _, cn := range idle {
			cn.closeIfIdle()
		}
		if left == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Close stops accepting and closes every connection at once.
func (s *Server) Close() error {
	s.closeListeners()
	s.closeHangups()
	s.mu.Lock()
	defer s.mu.Unlock()
	for cn := range s.conns {
		// Not waiting: closing a connection whose handler runs inside its
		// socket's Hold completes when the handler returns.
		go cn.c.Close()
	}
	return nil
}

func (s *Server) closeHangups() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hangups != nil {
		s.hangups.close()
	}
}

func (s *Server) closeListeners() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.shutdown.Swap(true) && s.stop != nil {
		close(s.stop)
	}
	for ln := range s.listeners {
		ln.Close()
	}
}

func (s *Server) getReader(c net.Conn) *bufio.Reader {
	if br, ok := s.readers.Get().(*bufio.Reader); ok {
		br.Reset(c)
		return br
	}
	return bufio.NewReaderSize(c, 4<<10)
}

func (s *Server) getWriter(c net.Conn) *bufio.Writer {
	if bw, ok := s.writers.Get().(*bufio.Writer); ok {
		bw.Reset(c)
		return bw
	}
	return bufio.NewWriterSize(c, 16<<10)
}

func (s *Server) putBuffers(br *bufio.Reader, bw *bufio.Writer) {
	br.Reset(nil)
	bw.Reset(nil)
	s.readers.Put(br)
	s.writers.Put(bw)
}
