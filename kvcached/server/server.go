// Package server serves kvcached's block store over the Redis protocol: the
// subset LMCache's redis:// connector and Redis's own tools (redis-cli,
// redis-benchmark) send, with RESP2 and RESP3 replies and pipelining.
package server

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"strconv"
	"strings"
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

// Config configures a Server.
type Config struct {
	Store    *store.Store
	Logger   hclog.Logger
	Registry prometheus.Registerer
	// Password, when set, is required through AUTH or HELLO ... AUTH. Only
	// its SHA-256 is kept.
	Password string
	// MaxBulk bounds one argument; larger values get an error reply.
	MaxBulk int64
	// MaxClients bounds concurrent connections (0: 10000).
	MaxClients int
	// IdleTimeout closes connections idle this long (0: never).
	IdleTimeout time.Duration
	// InflightBytes bounds the bytes of values all connections hold between
	// reading a command and storing its value (default: 1/8 of the RAM tier,
	// at least 2 × MaxBulk). Ignored when Budget is set.
	InflightBytes int64
	// Budget, when set, is the in-flight budget to use, shared with other
	// holders of transient values (peer fetches).
	Budget *resp.Budget
}

// Commands counted individually in oasis_kvcached_commands_total.
const (
	cmdDel = iota
	cmdExists
	cmdExpire
	cmdGet
	cmdMget
	cmdMset
	cmdSet
	numCounted
)

var countedNames = [numCounted]string{"del", "exists", "expire", "get", "mget", "mset", "set"}

// Server is a Redis-protocol front end to a store.Store.
type Server struct {
	cfg      Config
	log      hclog.Logger
	st       *store.Store
	passHash []byte
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

	mConns    prometheus.Gauge
	mCommands *prometheus.CounterVec
	mErrors   *prometheus.CounterVec
	cmdCount  [numCounted]prometheus.Counter
}

// New returns a Server; Serve starts it.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil {
		return nil, errors.New("creating server: store is required")
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.MaxBulk <= 0 {
		cfg.MaxBulk = cfg.Store.MaxValue()
	}
	if cfg.MaxClients <= 0 {
		cfg.MaxClients = 10000
	}
	s := &Server{cfg: cfg, log: cfg.Logger, st: cfg.Store, started: time.Now(), conns: map[net.Conn]struct{}{}}
	s.limits = resp.DefaultLimits
	s.limits.MaxBulk = cfg.MaxBulk
	if cfg.InflightBytes <= 0 {
		cfg.InflightBytes = max(cfg.Store.Stats().RAMLimit/8, 2*cfg.MaxBulk)
	}
	s.budget = cfg.Budget
	if s.budget == nil {
		s.budget = resp.NewBudget(cfg.InflightBytes)
	}
	if cfg.Password != "" {
		h := sha256.Sum256([]byte(cfg.Password))
		s.passHash = h[:]
	}
	s.mConns = prometheus.NewGauge(prometheus.GaugeOpts{Name: "oasis_kvcached_connections", Help: "Open Redis-protocol client connections."})
	s.mCommands = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_commands_total", Help: "Redis commands served, by command."}, []string{"command"})
	s.mErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_command_errors_total", Help: "Error replies, by kind (protocol, too_large, auth, unknown, args)."}, []string{"kind"})
	cfg.Registry.MustRegister(s.mConns, s.mCommands, s.mErrors)
	for i, name := range countedNames {
		s.cmdCount[i] = s.mCommands.WithLabelValues(name)
	}
	return s, nil
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
	c := &conn{
		id:     s.nextID.Add(1),
		nc:     nc,
		r:      resp.NewReader(bufio.NewReaderSize(nc, 64<<10), s.limits),
		w:      resp.NewWriter(nc, 64<<10),
		authed: s.passHash == nil,
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
	for !c.quit {
		if s.cfg.IdleTimeout > 0 {
			nc.SetReadDeadline(time.Now().Add(s.cfg.IdleTimeout))
		}
		args, err := c.r.ReadCommand()
		if err != nil {
			var tl *resp.TooLargeError
			var pe *resp.ProtocolError
			switch {
			case errors.As(err, &tl):
				s.mErrors.WithLabelValues("too_large").Inc()
				c.w.Error("ERR " + tl.Error())
			case errors.As(err, &pe):
				s.mErrors.WithLabelValues("protocol").Inc()
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

// getOrSet recognises GET and SET, nearly every command on the hot path, in
// any case, without copying the name first: comparing a lower-cased copy
// reads back bytes just stored one at a time, a store-forwarding stall. Its
// gain in CPU per SET is below what the shared test machine can measure.
func getOrSet(name []byte) string {
	if len(name) != 3 || name[1]|0x20 != 'e' || name[2]|0x20 != 't' {
		return ""
	}
	switch name[0] | 0x20 {
	case 'g':
		return "GET"
	case 's':
		return "SET"
	}
	return ""
}

// upper copies an ASCII command name in upper case into buf.
func upper(buf []byte, b []byte) []byte {
	buf = buf[:0]
	for _, c := range b {
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		buf = append(buf, c)
	}
	return buf
}

func (s *Server) argErr(c *conn, cmd string) {
	s.mErrors.WithLabelValues("args").Inc()
	c.w.Error("ERR wrong number of arguments for '" + strings.ToLower(cmd) + "' command")
}

func (s *Server) dispatch(ctx context.Context, c *conn, args [][]byte) {
	var nameBuf [32]byte
	name := args[0]
	var cmd string
	if fast := getOrSet(name); fast != "" {
		cmd = fast
	} else {
		if len(name) > len(nameBuf) {
			s.mErrors.WithLabelValues("unknown").Inc()
			c.w.Error("ERR unknown command")
			return
		}
		cmd = string(upper(nameBuf[:], name))
	}
	if !c.authed {
		switch cmd {
		case "AUTH", "HELLO", "QUIT":
		default:
			s.mErrors.WithLabelValues("auth").Inc()
			c.w.Error("NOAUTH Authentication required.")
			return
		}
	}
	w := c.w
	n := len(args)
	switch cmd {
	case "GET":
		if n != 2 {
			s.argErr(c, "GET")
			return
		}
		c.counted[cmdGet]++
		// Borrowed: a large reply is written out before Bulk returns (a
		// small one copied), so the value can go back at once.
		if v, loan, _, ok := s.st.Borrow(ctx, string(args[1])); ok {
			w.Bulk(v)
			s.st.Release(loan)
		} else {
			w.Null()
		}
	case "SET":
		c.counted[cmdSet]++
		s.cmdSet(ctx, c, args)
	case "EXISTS":
		if n < 2 {
			s.argErr(c, "EXISTS")
			return
		}
		c.counted[cmdExists]++
		var cnt int64
		for _, k := range args[1:] {
			if s.st.Exists(ctx, string(k)) {
				cnt++
			}
		}
		w.Int(cnt)
	case "DEL", "UNLINK":
		if n < 2 {
			s.argErr(c, cmd)
			return
		}
		c.counted[cmdDel]++
		var cnt int64
		for _, k := range args[1:] {
			if s.st.Delete(string(k)) {
				cnt++
			}
		}
		w.Int(cnt)
	case "MGET":
		if n < 2 {
			s.argErr(c, "MGET")
			return
		}
		c.counted[cmdMget]++
		w.Array(n - 1)
		for _, k := range args[1:] {
			if v, loan, _, ok := s.st.Borrow(ctx, string(k)); ok {
				w.Bulk(v)
				s.st.Release(loan)
			} else {
				w.Null()
			}
		}
	case "MSET":
		if n < 3 || n%2 != 1 {
			s.argErr(c, "MSET")
			return
		}
		c.counted[cmdMset]++
		for i := 1; i < n; i += 2 {
			if int64(len(args[i+1])) > s.st.MaxValue() {
				s.mErrors.WithLabelValues("too_large").Inc()
				w.Error(fmt.Sprintf("ERR value of %d bytes exceeds the %d-byte limit", len(args[i+1]), s.st.MaxValue()))
				return
			}
		}
		for i := 1; i < n; i += 2 {
			if _, err := s.st.Set(string(args[i]), own(args[i+1]), 0, store.SetAlways); err != nil {
				w.Error("ERR " + err.Error())
				return
			}
		}
		w.OK()
	case "PING":
		switch n {
		case 1:
			w.Simple("PONG")
		case 2:
			w.Bulk(args[1])
		default:
			s.argErr(c, "PING")
		}
	case "ECHO":
		if n != 2 {
			s.argErr(c, "ECHO")
			return
		}
		w.Bulk(args[1])
	case "EXPIRE", "PEXPIRE":
		if n < 3 {
			s.argErr(c, cmd)
			return
		}
		c.counted[cmdExpire]++
		d, err := strconv.ParseInt(string(args[2]), 10, 64)
		if err != nil {
			w.Error("ERR value is not an integer or out of range")
			return
		}
		unit := time.Second
		if cmd == "PEXPIRE" {
			unit = time.Millisecond
		}
		if d > int64(1<<62)/int64(unit) || d < -int64(1<<62)/int64(unit) {
			w.Error("ERR invalid expire time in '" + strings.ToLower(cmd) + "' command")
			return
		}
		key := string(args[1])
		if d <= 0 {
			// Redis deletes a key given a non-positive expiry.
			if s.st.Delete(key) {
				w.Int(1)
			} else {
				w.Int(0)
			}
			return
		}
		if s.st.Expire(key, time.Now().Add(time.Duration(d)*unit).UnixNano()) {
			w.Int(1)
		} else {
			w.Int(0)
		}
	case "PERSIST":
		if n != 2 {
			s.argErr(c, "PERSIST")
			return
		}
		at, ok := s.st.ExpireAt(string(args[1]))
		if ok && at != 0 && s.st.Expire(string(args[1]), 0) {
			w.Int(1)
		} else {
			w.Int(0)
		}
	case "TTL", "PTTL":
		if n != 2 {
			s.argErr(c, cmd)
			return
		}
		at, ok := s.st.ExpireAt(string(args[1]))
		switch {
		case !ok:
			w.Int(-2)
		case at == 0:
			w.Int(-1)
		default:
			left := time.Until(time.Unix(0, at))
			if cmd == "TTL" {
				w.Int(int64((left + time.Second/2) / time.Second))
			} else {
				w.Int(left.Milliseconds())
			}
		}
	case "TYPE":
		if n != 2 {
			s.argErr(c, "TYPE")
			return
		}
		if _, ok := s.st.ExpireAt(string(args[1])); ok {
			w.Simple("string")
		} else {
			w.Simple("none")
		}
	case "SCAN":
		s.cmdScan(c, args)
	case "KEYS":
		if n != 2 {
			s.argErr(c, "KEYS")
			return
		}
		pat := args[1]
		var out []string
		for _, k := range s.st.Keys() {
			if globMatch(pat, []byte(k)) {
				out = append(out, k)
			}
		}
		w.Array(len(out))
		for _, k := range out {
			w.BulkString(k)
		}
	case "DBSIZE":
		w.Int(int64(s.st.Len()))
	case "INFO":
		s.publish(c) // count what this connection ran before INFO
		section := ""
		if n > 1 {
			section = strings.ToLower(string(args[1]))
		}
		w.Verbatim(s.info(section))
	case "CONFIG":
		s.cmdConfig(c, args)
	case "AUTH":
		s.cmdAuth(c, args)
	case "HELLO":
		s.cmdHello(c, args)
	case "SELECT":
		if n != 2 {
			s.argErr(c, "SELECT")
			return
		}
		if string(args[1]) == "0" {
			w.OK()
		} else {
			w.Error("ERR DB index is out of range")
		}
	case "CLIENT":
		s.cmdClient(c, args)
	case "COMMAND":
		// redis-cli asks for command docs to drive hints; an empty reply
		// makes it fall back to its built-in table.
		if n > 1 && strings.EqualFold(string(args[1]), "COUNT") {
			w.Int(0)
			return
		}
		w.Array(0)
	case "QUIT":
		w.OK()
		c.quit = true
	case "RESET":
		w.SetProtocol(2)
		c.name = ""
		c.authed = s.passHash == nil
		w.Simple("RESET")
	case "FLUSHALL", "FLUSHDB":
		for _, k := range s.st.Keys() {
			s.st.Delete(k)
		}
		w.OK()
	default:
		s.mErrors.WithLabelValues("unknown").Inc()
		w.Error(fmt.Sprintf("ERR unknown command '%s', with args beginning with: ", truncate(string(name), 64)))
	}
}

// own returns a value the store may keep: small arguments share the
// reader's slab, so they are copied rather than pinning it.
func own(v []byte) []byte {
	if len(v) <= 64 {
		return bytes.Clone(v)
	}
	return v
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// setError replies to a SET the store refused.
func (s *Server) setError(c *conn, err error) {
	var tl *store.ValueTooLargeError
	if errors.As(err, &tl) {
		s.mErrors.WithLabelValues("too_large").Inc()
	}
	c.w.Error("ERR " + err.Error())
}

func (s *Server) cmdSet(ctx context.Context, c *conn, args [][]byte) {
	w := c.w
	if len(args) < 3 {
		s.argErr(c, "SET")
		return
	}
	if len(args) == 3 {
		// SET key value, what nearly every client sends: the store makes
		// the key's string only if the key is new.
		if err := s.st.SetKey(args[1], own(args[2])); err != nil {
			s.setError(c, err)
			return
		}
		w.OK()
		return
	}
	key := string(args[1])
	mode := store.SetAlways
	var expireAt int64
	keepTTL, get := false, false
	for i := 3; i < len(args); i++ {
		var ob [8]byte
		if len(args[i]) > len(ob) {
			w.Error("ERR syntax error")
			return
		}
		opt := string(upper(ob[:], args[i]))
		switch opt {
		case "NX", "XX":
			if mode != store.SetAlways {
				w.Error("ERR syntax error")
				return
			}
			mode = store.SetNX
			if opt == "XX" {
				mode = store.SetXX
			}
		case "KEEPTTL":
			keepTTL = true
		case "GET":
			get = true
		case "EX", "PX", "EXAT", "PXAT":
			if i+1 >= len(args) || expireAt != 0 {
				w.Error("ERR syntax error")
				return
			}
			i++
			v, err := strconv.ParseInt(string(args[i]), 10, 64)
			if err != nil {
				w.Error("ERR value is not an integer or out of range")
				return
			}
			if v <= 0 || v > 1<<44 {
				w.Error("ERR invalid expire time in 'set' command")
				return
			}
			switch opt {
			case "EX":
				expireAt = time.Now().Add(time.Duration(v) * time.Second).UnixNano()
			case "PX":
				expireAt = time.Now().Add(time.Duration(v) * time.Millisecond).UnixNano()
			case "EXAT":
				expireAt = time.Unix(v, 0).UnixNano()
			case "PXAT":
				expireAt = time.UnixMilli(v).UnixNano()
			}
		default:
			w.Error("ERR syntax error")
			return
		}
	}
	if keepTTL && expireAt != 0 {
		w.Error("ERR syntax error")
		return
	}
	if keepTTL {
		expireAt, _ = s.st.ExpireAt(key)
	}
	var old []byte
	var hadOld bool
	if get {
		old, _, hadOld = s.st.Get(ctx, key)
	}
	ok, err := s.st.Set(key, own(args[2]), expireAt, mode)
	if err != nil {
		s.setError(c, err)
		return
	}
	switch {
	case get && hadOld:
		w.Bulk(old)
	case get || !ok:
		w.Null()
	default:
		w.OK()
	}
}

func (s *Server) cmdScan(c *conn, args [][]byte) {
	w := c.w
	if len(args) < 2 {
		s.argErr(c, "SCAN")
		return
	}
	cursor, err := strconv.ParseUint(string(args[1]), 10, 64)
	if err != nil {
		w.Error("ERR invalid cursor")
		return
	}
	count := 10
	var pattern []byte
	for i := 2; i < len(args); i += 2 {
		if i+1 >= len(args) {
			w.Error("ERR syntax error")
			return
		}
		switch strings.ToUpper(string(args[i])) {
		case "COUNT":
			n, err := strconv.Atoi(string(args[i+1]))
			if err != nil || n < 1 {
				w.Error("ERR value is not an integer or out of range")
				return
			}
			count = n
		case "MATCH":
			pattern = args[i+1]
		case "TYPE":
			if !strings.EqualFold(string(args[i+1]), "string") {
				pattern = nil
				count = 0
				w.Array(2)
				w.BulkString("0")
				w.Array(0)
				return
			}
		default:
			w.Error("ERR syntax error")
			return
		}
	}
	var match func(string) bool
	if pattern != nil {
		match = func(k string) bool { return globMatch(pattern, []byte(k)) }
	}
	keys, next := s.st.Scan(cursor, count, match)
	w.Array(2)
	w.BulkString(strconv.FormatUint(next, 10))
	w.Array(len(keys))
	for _, k := range keys {
		w.BulkString(k)
	}
}

func (s *Server) checkPassword(pass []byte) bool {
	if s.passHash == nil {
		return false
	}
	h := sha256.Sum256(pass)
	return subtle.ConstantTimeCompare(h[:], s.passHash) == 1
}

func (s *Server) cmdAuth(c *conn, args [][]byte) {
	w := c.w
	var user, pass []byte
	switch len(args) {
	case 2:
		pass = args[1]
	case 3:
		user, pass = args[1], args[2]
	default:
		s.argErr(c, "AUTH")
		return
	}
	if s.passHash == nil {
		s.mErrors.WithLabelValues("auth").Inc()
		w.Error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
		return
	}
	if (user != nil && string(user) != "default") || !s.checkPassword(pass) {
		s.mErrors.WithLabelValues("auth").Inc()
		w.Error("WRONGPASS invalid username-password pair or user is disabled.")
		return
	}
	c.authed = true
	w.OK()
}

func (s *Server) cmdHello(c *conn, args [][]byte) {
	w := c.w
	proto := w.Protocol()
	i := 1
	if len(args) > 1 {
		v, err := strconv.Atoi(string(args[1]))
		if err != nil {
			w.Error("ERR Protocol version is not an integer or out of range")
			return
		}
		if v != 2 && v != 3 {
			w.Error("NOPROTO unsupported protocol version")
			return
		}
		proto = v
		i = 2
	}
	for ; i < len(args); i++ {
		switch strings.ToUpper(string(args[i])) {
		case "AUTH":
			if i+2 >= len(args) {
				w.Error("ERR syntax error")
				return
			}
			if string(args[i+1]) != "default" || !s.checkPassword(args[i+2]) {
				s.mErrors.WithLabelValues("auth").Inc()
				w.Error("WRONGPASS invalid username-password pair or user is disabled.")
				return
			}
			c.authed = true
			i += 2
		case "SETNAME":
			if i+1 >= len(args) {
				w.Error("ERR syntax error")
				return
			}
			c.name = string(args[i+1])
			i++
		default:
			w.Error("ERR syntax error")
			return
		}
	}
	if !c.authed {
		s.mErrors.WithLabelValues("auth").Inc()
		w.Error("NOAUTH HELLO must be called with the client already authenticated, otherwise the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the client and select the RESP protocol version at the same time")
		return
	}
	w.SetProtocol(proto)
	w.Map(7)
	w.BulkString("server")
	w.BulkString("redis")
	w.BulkString("version")
	w.BulkString(Version)
	w.BulkString("proto")
	w.Int(int64(proto))
	w.BulkString("id")
	w.Int(c.id)
	w.BulkString("mode")
	w.BulkString("standalone")
	w.BulkString("role")
	w.BulkString("master")
	w.BulkString("modules")
	w.Array(0)
}

func (s *Server) cmdClient(c *conn, args [][]byte) {
	w := c.w
	if len(args) < 2 {
		s.argErr(c, "CLIENT")
		return
	}
	switch strings.ToUpper(string(args[1])) {
	case "SETNAME":
		if len(args) != 3 {
			s.argErr(c, "CLIENT|SETNAME")
			return
		}
		c.name = string(args[2])
		w.OK()
	case "GETNAME":
		if c.name == "" {
			w.Null()
		} else {
			w.BulkString(c.name)
		}
	case "ID":
		w.Int(c.id)
	case "SETINFO", "NO-EVICT", "NO-TOUCH", "REPLY":
		w.OK()
	case "INFO":
		w.BulkString(fmt.Sprintf("id=%d addr=%s name=%s db=0 resp=%d\n", c.id, c.nc.RemoteAddr(), c.name, w.Protocol()))
	default:
		w.Error("ERR unknown subcommand '" + truncate(string(args[1]), 64) + "'. Try CLIENT HELP.")
	}
}

// cmdConfig answers CONFIG GET for the parameters clients ask about
// (redis-benchmark reads save and appendonly); CONFIG SET is refused.
func (s *Server) cmdConfig(c *conn, args [][]byte) {
	w := c.w
	if len(args) < 2 {
		s.argErr(c, "CONFIG")
		return
	}
	switch strings.ToUpper(string(args[1])) {
	case "GET":
		if len(args) < 3 {
			s.argErr(c, "CONFIG|GET")
			return
		}
		st := s.st.Stats()
		params := [][2]string{
			{"save", ""},
			{"appendonly", "no"},
			{"databases", "1"},
			{"maxmemory", strconv.FormatInt(st.RAMLimit, 10)},
			{"maxmemory-policy", "allkeys-lru"},
			{"proto-max-bulk-len", strconv.FormatInt(s.cfg.MaxBulk, 10)},
			{"maxclients", strconv.Itoa(s.cfg.MaxClients)},
			{"timeout", strconv.Itoa(int(s.cfg.IdleTimeout / time.Second))},
			{"port", strconv.Itoa(s.port)},
		}
		var out [][2]string
		for _, p := range params {
			for _, pat := range args[2:] {
				if globMatch([]byte(strings.ToLower(string(pat))), []byte(p[0])) {
					out = append(out, p)
					break
				}
			}
		}
		w.Map(len(out))
		for _, p := range out {
			w.BulkString(p[0])
			w.BulkString(p[1])
		}
	case "SET":
		w.Error("ERR CONFIG SET is not supported by oasis-kvcached; use its command-line flags")
	case "RESETSTAT":
		w.OK()
	default:
		w.Error("ERR unknown subcommand '" + truncate(string(args[1]), 64) + "'. Try CONFIG HELP.")
	}
}

func (s *Server) info(section string) string {
	st := s.st.Stats()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	all := section == "" || section == "all" || section == "default" || section == "everything"
	var b strings.Builder
	add := func(name string, lines ...string) {
		if !all && section != name {
			return
		}
		if b.Len() > 0 {
			b.WriteString("\r\n")
		}
		b.WriteString("# " + strings.ToUpper(name[:1]) + name[1:] + "\r\n")
		for _, l := range lines {
			b.WriteString(l + "\r\n")
		}
	}
	up := time.Since(s.started)
	add("server",
		"redis_version:"+Version,
		"redis_mode:standalone",
		"server_name:oasis-kvcached",
		"os:"+runtime.GOOS,
		"arch_bits:64",
		"process_id:"+strconv.Itoa(os.Getpid()),
		"tcp_port:"+strconv.Itoa(s.port),
		"uptime_in_seconds:"+strconv.FormatInt(int64(up/time.Second), 10),
		"uptime_in_days:"+strconv.FormatInt(int64(up/(24*time.Hour)), 10),
	)
	add("clients", "connected_clients:"+strconv.FormatInt(s.clients.Load(), 10), "maxclients:"+strconv.Itoa(s.cfg.MaxClients), "blocked_clients:0")
	add("memory",
		"used_memory:"+strconv.FormatUint(ms.HeapAlloc, 10),
		"used_memory_rss:"+strconv.FormatUint(ms.Sys, 10),
		"maxmemory:"+strconv.FormatInt(st.RAMLimit, 10),
		"maxmemory_policy:allkeys-lru",
	)
	add("persistence", "loading:0", "async_loading:0", "rdb_changes_since_last_save:0", "aof_enabled:0")
	add("stats", "total_commands_processed:"+strconv.FormatInt(s.commands.Load(), 10), "total_connections_received:"+strconv.FormatInt(s.nextID.Load(), 10))
	add("replication", "role:master", "connected_slaves:0")
	deg := 0
	if st.DiskDegraded {
		deg = 1
	}
	add("kvcached",
		"ram_blocks:"+strconv.Itoa(st.RAMBlocks),
		"ram_bytes:"+strconv.FormatInt(st.RAMBytes, 10),
		"ram_limit_bytes:"+strconv.FormatInt(st.RAMLimit, 10),
		"disk_blocks:"+strconv.Itoa(st.DiskBlocks),
		"disk_bytes:"+strconv.FormatInt(st.DiskBytes, 10),
		"disk_limit_bytes:"+strconv.FormatInt(st.DiskLimit, 10),
		"disk_degraded:"+strconv.Itoa(deg),
	)
	if all || section == "keyspace" {
		lines := []string{}
		if n := s.st.Len(); n > 0 {
			lines = append(lines, fmt.Sprintf("db0:keys=%d,expires=0,avg_ttl=0", n))
		}
		add("keyspace", lines...)
	}
	return b.String()
}

// globMatch implements Redis's glob patterns: * ? [abc] [^a-z] and \ escapes.
func globMatch(p, s []byte) bool {
	for len(p) > 0 {
		switch p[0] {
		case '*':
			for len(p) > 1 && p[1] == '*' {
				p = p[1:]
			}
			if len(p) == 1 {
				return true
			}
			for i := 0; i <= len(s); i++ {
				if globMatch(p[1:], s[i:]) {
					return true
				}
			}
			return false
		case '?':
			if len(s) == 0 {
				return false
			}
			p, s = p[1:], s[1:]
		case '[':
			if len(s) == 0 {
				return false
			}
			end := 1
			neg := end < len(p) && p[end] == '^'
			if neg {
				end++
			}
			matched := false
			for end < len(p) && p[end] != ']' {
				if p[end] == '\\' && end+1 < len(p) {
					end++
					if p[end] == s[0] {
						matched = true
					}
				} else if end+2 < len(p) && p[end+1] == '-' && p[end+2] != ']' {
					lo, hi := p[end], p[end+2]
					if lo > hi {
						lo, hi = hi, lo
					}
					if lo <= s[0] && s[0] <= hi {
						matched = true
					}
					end += 2
				} else if p[end] == s[0] {
					matched = true
				}
				end++
			}
			if end >= len(p) { // unterminated class: treat '[' literally
				if s[0] != '[' {
					return false
				}
				p, s = p[1:], s[1:]
				continue
			}
			if matched == neg {
				return false
			}
			p, s = p[end+1:], s[1:]
		case '\\':
			if len(p) > 1 {
				p = p[1:]
			}
			fallthrough
		default:
			if len(s) == 0 || p[0] != s[0] {
				return false
			}
			p, s = p[1:], s[1:]
		}
	}
	return len(s) == 0
}
