// Package server serves kvcached's block store over the Redis protocol: the
// subset LMCache's redis:// connector and Redis's own tools (redis-cli,
// redis-benchmark) send, with RESP2 and RESP3 replies and pipelining.
package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/kvcached/resp"
	"github.com/oasis-llm/oasis/kvcached/store"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"
)

// Version is what INFO and HELLO report as the server version; clients use
// it for feature checks, so it names the Redis version whose commands are
// mirrored.
const Version = "7.2.0"

// Defaults of Config's timeouts.
const (
	DefaultIdleTimeout = 300 * time.Second
	DefaultAuthTimeout = 10 * time.Second
	// DefaultMaxAuthFailures is how many failed AUTH (or HELLO ... AUTH)
	// attempts a connection gets before it is closed.
	DefaultMaxAuthFailures = 3
	// DefaultAuthFailureDelay is how long the reply to a failed AUTH waits.
	DefaultAuthFailureDelay = 100 * time.Millisecond
)

// Config configures a Server.
type Config struct {
	Store *store.Store
	// Logger receives the server's logs; nil discards them.
	Logger hclog.Logger
	// Registerer takes the server's metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// Password, when set, is required through AUTH or HELLO ... AUTH. Only
	// its SHA-256 is kept.
	Password string
	// MaxBulk bounds one argument; larger values get an error reply.
	MaxBulk int64
	// MaxClients bounds concurrent connections (0: 10000).
	MaxClients int
	// IdleTimeout closes connections that send no command for this long, so
	// idle or abandoned connections cannot hold MaxClients' slots (default
	// DefaultIdleTimeout; negative: never).
	IdleTimeout time.Duration
	// AuthTimeout closes connections that have not authenticated this long
	// after connecting, when a password is set (default DefaultAuthTimeout;
	// negative: never).
	AuthTimeout time.Duration
	// InflightBytes bounds the bytes of values all connections hold between
	// reading a command and storing its value (default: 1/8 of the RAM tier,
	// at least 2 × MaxBulk). Ignored when Budget is set.
	InflightBytes int64
	// Budget, when set, is the in-flight budget to use, shared with other
	// holders of transient values (peer fetches).
	Budget *resp.Budget
	// UnauthenticatedBytes bounds what connections that have not
	// authenticated hold together, buffers and arguments (see preauth.go;
	// default: 1/16 of the in-flight budget, at least 256 connections'
	// worth; at least 4 connections' worth). Without a password every
	// connection is authenticated.
	UnauthenticatedBytes int64
	// MaxAuthFailures closes a connection after this many failed AUTH
	// attempts (default DefaultMaxAuthFailures; negative: never).
	MaxAuthFailures int
	// AuthFailureDelay delays the reply to each failed AUTH (default
	// DefaultAuthFailureDelay; negative: none), so guesses per connection
	// are slow and, with UnauthenticatedBytes bounding the connections that
	// may be guessing, guesses in all are too.
	AuthFailureDelay time.Duration
}

// Server is a Redis-protocol front end to a store.Store.
type Server struct {
	cfg Config
	log hclog.Logger
	st  *store.Store
	// passHash is the password's SHA-256, nil without a password; swapped
	// by SetPassword while connections read it.
	passHash atomic.Pointer[[]byte]
	started  time.Time
	limits   resp.Limits

	nextID    atomic.Int64
	clients   atomic.Int64
	commands  atomic.Int64
	mu        sync.Mutex
	listeners []net.Listener
	conns     map[net.Conn]struct{}
	wg        sync.WaitGroup
	closed    atomic.Bool
	port      int
	budget    *resp.Budget

	preAuth preAuthPool

	mConns    prometheus.Gauge
	mCommands *prometheus.CounterVec
	mErrors   *prometheus.CounterVec
	mClosed   *prometheus.CounterVec
	mAuthFail prometheus.Counter
	cmdCount  [numCounted]prometheus.Counter
}

// Reasons in oasis_kvcached_connections_closed_total.
const (
	closedUnauthEvicted = "unauthenticated_evicted"
	closedUnauthMemory  = "unauthenticated_memory"
	closedAuthFailures  = "auth_failures"
)

// New returns a Server; Serve starts it.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("creating server: store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	if cfg.MaxBulk <= 0 {
		cfg.MaxBulk = cfg.Store.MaxValue()
	}
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = 10000
	}
	switch {
	case cfg.IdleTimeout == 0:
		cfg.IdleTimeout = DefaultIdleTimeout
	case cfg.IdleTimeout < 0:
		cfg.IdleTimeout = 0
	}
	switch {
	case cfg.AuthTimeout == 0:
		cfg.AuthTimeout = DefaultAuthTimeout
	case cfg.AuthTimeout < 0:
		cfg.AuthTimeout = 0
	}
	s := &Server{cfg: cfg, log: cfg.Logger, st: cfg.Store, started: time.Now(), conns: map[net.Conn]struct{}{}}
	s.limits = resp.DefaultLimits()
	s.limits.MaxBulk = cfg.MaxBulk
	if cfg.InflightBytes <= 0 {
		cfg.InflightBytes = max(cfg.Store.Stats().RAMLimit/8, 2*cfg.MaxBulk)
	}
	s.budget = cfg.Budget
	if s.budget == nil {
		s.budget = resp.NewBudget(cfg.InflightBytes)
	}
	if cfg.UnauthenticatedBytes <= 0 {
		cfg.UnauthenticatedBytes = max(s.budget.Limit()/16, 256*preAuthConnBytes)
	}
	// A few connections at least, or no client could authenticate.
	cfg.UnauthenticatedBytes = max(cfg.UnauthenticatedBytes, 4*preAuthConnBytes)
	switch {
	case cfg.MaxAuthFailures == 0:
		cfg.MaxAuthFailures = DefaultMaxAuthFailures
	case cfg.MaxAuthFailures < 0:
		cfg.MaxAuthFailures = 0
	}
	switch {
	case cfg.AuthFailureDelay == 0:
		cfg.AuthFailureDelay = DefaultAuthFailureDelay
	case cfg.AuthFailureDelay < 0:
		cfg.AuthFailureDelay = 0
	}
	s.cfg = cfg
	s.preAuth.limit = cfg.UnauthenticatedBytes
	s.SetPassword(cfg.Password)
	s.mConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "oasis_kvcached_connections", Help: "Open Redis-protocol client connections."})
	s.mCommands = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_commands_total", Help: "Redis commands served, by command."}, []string{"command"})
	s.mErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_command_errors_total", Help: "Error replies, by kind (protocol, too_large, auth, unknown, args)."}, []string{"kind"})
	s.mClosed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_connections_closed_total", Help: "Connections the server closed to protect itself, by reason: unauthenticated_evicted (the oldest unauthenticated connections, to make room for a new one), unauthenticated_memory (an unauthenticated command's argument over the allowance), auth_failures (too many failed AUTH attempts)."}, []string{"reason"})
	s.mAuthFail = prometheus.NewCounter(prometheus.CounterOpts{Name: "oasis_kvcached_auth_failures_total", Help: "Failed AUTH and HELLO ... AUTH attempts (wrong password or user)."})
	evicted := s.mClosed.WithLabelValues(closedUnauthEvicted)
	s.preAuth.onEvict = evicted.Inc
	unauthBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "oasis_kvcached_unauthenticated_bytes", Help: "Bytes charged to connections that have not authenticated (buffers and arguments), within the allowance."},
		func() float64 { u, _ := s.preAuth.stats(); return float64(u) })
	unauthConns := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "oasis_kvcached_unauthenticated_connections", Help: "Connections that have not authenticated yet."},
		func() float64 { _, n := s.preAuth.stats(); return float64(n) })
	cfg.Registerer.MustRegister(s.mConns, s.mCommands, s.mErrors, s.mClosed, s.mAuthFail, unauthBytes, unauthConns)
	for i, name := range countedNames {
		s.cmdCount[i] = s.mCommands.WithLabelValues(name)
	}
	return s, nil
}

// SetPassword replaces the password ("": none) for authentications from now
// on; connections that already authenticated stay authenticated, as in Redis
// after CONFIG SET requirepass.
func (s *Server) SetPassword(password string) {
	if password == "" {
		s.passHash.Store(nil)
		return
	}
	h := sha256.Sum256([]byte(password))
	b := h[:]
	s.passHash.Store(&b)
}

// Serve accepts connections on l until Close.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed.Load() {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.listeners = append(s.listeners, l)
	if a, ok := l.Addr().(*net.TCPAddr); ok {
		s.port = a.Port
	}
	s.mu.Unlock()
	for {
		c, err := l.Accept()
		if err != nil {
			if s.closed.Load() {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return fmt.Errorf("accepting connections: %w", err)
		}
		if s.clients.Load() >= int64(s.cfg.MaxClients) {
			c.Write([]byte("-ERR max number of clients reached\r\n"))
			c.Close()
			continue
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.serveConn(c)
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// Close stops listening, closes client connections and waits for them.
func (s *Server) Close() error {
	s.closed.Store(true)
	s.mu.Lock()
	for _, l := range s.listeners {
		l.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

type conn struct {
	id     int64
	nc     net.Conn
	r      *resp.Reader
	w      *resp.Writer
	authed bool
	name   string
	quit   bool
	// authFails counts failed AUTH attempts (see authFailed).
	authFails int
	// Commands served since the last publish: counted here and added to the
	// shared counters once per flushed batch, since a shared atomic per
	// command contends between cores on the pipelined hot path.
	cmds    int64
	counted [numCounted]int64
}

// publish adds the connection's command counts to the server's.
func (s *Server) publish(c *conn) {
	if c.cmds == 0 {
		return
	}
	s.commands.Add(c.cmds)
	c.cmds = 0
	for i, n := range c.counted {
		if n != 0 {
			s.cmdCount[i].Add(float64(n))
			c.counted[i] = 0
		}
	}
}

func (s *Server) serveConn(nc net.Conn) {
	s.clients.Add(1)
	s.mConns.Inc()
	defer func() {
		s.clients.Add(-1)
		s.mConns.Dec()
		nc.Close()
	}()
	if tc, ok := nc.(*net.TCPConn); ok {
		tc.SetNoDelay(true)
	}
	authed := s.passHash.Load() == nil
	bufSize, wbufSize := connBuffer, connBuffer
	var hold *preAuthHold
	if !authed {
		if hold = s.preAuth.admit(nc); hold == nil {
			s.mClosed.WithLabelValues(closedUnauthMemory).Inc()
			nc.Write([]byte("-ERR " + resp.ErrUnauthenticatedMemory.Error() + "\r\n"))
			return
		}
		defer func() { hold.end() }()
		bufSize, wbufSize = preAuthReadBuffer, preAuthWriteBuffer
	}
	c := &conn{
		id:     s.nextID.Add(1),
		nc:     nc,
		r:      resp.NewReader(bufio.NewReaderSize(nc, bufSize), s.limits),
		w:      resp.NewWriter(nc, wbufSize),
		authed: authed,
	}
	if hold != nil {
		c.r.SetAllowance(hold)
	}
	c.r.SetBudget(s.budget)
	c.r.SetPool(s.st.BufferPool())
	if tc, ok := nc.(*net.TCPConn); ok {
		if raw, err := tc.SyscallConn(); err == nil {
			c.r.SetLowWater(func(n int) {
				_ = raw.Control(func(fd uintptr) { _ = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVLOWAT, n) })
			})
		}
	}
	defer c.r.Done()
	defer s.publish(c)
	ctx := context.Background()
	var authBy time.Time
	if !c.authed && s.cfg.AuthTimeout > 0 {
		authBy = time.Now().Add(s.cfg.AuthTimeout)
	}
	// The read deadline is moved on when the reader may block (nothing
	// buffered) and every deadlineEvery commands otherwise, rather than
	// before every command: setting it costs a timer update, a share of a
	// small pipelined command's CPU.
	const deadlineEvery = 256
	sinceDeadline := deadlineEvery
	deadlineSet, wasAuthed := false, c.authed
	for !c.quit {
		if c.authed != wasAuthed {
			if c.authed {
				// Authenticated: full buffers, charged to nothing.
				hold.end()
				c.r.Grow(nc, connBuffer)
				c.w.Grow(connBuffer)
			} else {
				// RESET dropped the authentication.
				hold = s.preAuth.detached(nc)
				c.r.SetAllowance(hold)
			}
		}
		c.r.SetUnauthenticated(!c.authed)
		if sinceDeadline++; sinceDeadline >= deadlineEvery || c.r.Buffered() == 0 || c.authed != wasAuthed {
			sinceDeadline, wasAuthed = 0, c.authed
			var d time.Time
			if s.cfg.IdleTimeout > 0 {
				d = time.Now().Add(s.cfg.IdleTimeout)
			}
			if !c.authed && !authBy.IsZero() && (d.IsZero() || authBy.Before(d)) {
				d = authBy
			}
			if !d.IsZero() || deadlineSet {
				nc.SetReadDeadline(d)
				deadlineSet = !d.IsZero()
			}
		}
		args, err := c.r.ReadCommand()
		if err != nil {
			var tl *resp.TooLargeError
			var ob *resp.OverBudgetError
			var pe *resp.ProtocolError
			switch {
			case errors.As(err, &tl):
				s.mErrors.WithLabelValues("too_large").Inc()
				c.w.Error("ERR " + tl.Error())
			case errors.As(err, &ob):
				s.mErrors.WithLabelValues("too_large").Inc()
				c.w.Error("ERR " + ob.Error())
			case errors.As(err, &pe):
				s.mErrors.WithLabelValues("protocol").Inc()
				if errors.Is(err, resp.ErrUnauthenticatedMemory) && !hold.wasEvicted() {
					s.mClosed.WithLabelValues(closedUnauthMemory).Inc()
				}
				c.w.Error("ERR " + pe.Error())
				c.w.Flush()
				return
			default:
				if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
					s.log.Debug("reading command", "client", c.id, "error", err)
				}
				return
			}
		} else if len(args) > 0 {
			c.cmds++
			s.dispatch(ctx, c, args)
		}
		c.r.Done()
		if c.r.Buffered() == 0 || c.quit {
			s.publish(c)
			if err := c.w.Flush(); err != nil {
				return
			}
		}
	}
}
