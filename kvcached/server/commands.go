package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/oasis-llm/oasis/kvcached/store"
)

// command is one row of the command table, laid out as Redis's own
// (redisCommandTable): the name, how many arguments it takes, what kind of
// command it is and the function that runs it. dispatch checks
// authentication and arity from the row, so a handler starts from valid
// input.
type command struct {
	// name is the name in lower case, as Redis's error replies spell it.
	name string
	// arity counts the arguments with the name itself, as Redis does: n > 0
	// takes exactly n, n < 0 at least -n.
	arity int
	flags commandFlags
	// counted is the command's series in oasis_kvcached_commands_total, or
	// notCounted.
	counted int
	run     func(s *Server, ctx context.Context, c *conn, args [][]byte)
}

// commandFlags say what kind of command a row is, with Redis's meanings.
type commandFlags uint8

const (
	// flagWrite: the command may change the keyspace.
	flagWrite commandFlags = 1 << iota
	// flagReadOnly: the command reads keys and never changes them.
	flagReadOnly
	// flagNoAuth: the command runs before the connection has authenticated.
	flagNoAuth
	// flagPairs: the arguments after the name come in key-value pairs.
	flagPairs
)

// Commands counted individually in oasis_kvcached_commands_total; commands
// outside this list are only in the INFO total.
const (
	notCounted = iota - 1
	cmdDel
	cmdExists
	cmdExpire
	cmdGet
	cmdMget
	cmdMset
	cmdSet
	numCounted
)

var countedNames = [numCounted]string{"del", "exists", "expire", "get", "mget", "mset", "set"}

// getCommand and setCommand are nearly every command on the hot path:
// getOrSet finds them without the table.
var (
	getCommand = &command{name: "get", arity: 2, flags: flagReadOnly, counted: cmdGet, run: (*Server).cmdGet}
	setCommand = &command{name: "set", arity: -3, flags: flagWrite, counted: cmdSet, run: (*Server).cmdSet}
)

// commandTable holds every command kvcached serves, by upper-case name.
var commandTable = commandsByName([]*command{
	getCommand,
	setCommand,
	{name: "exists", arity: -2, flags: flagReadOnly, counted: cmdExists, run: (*Server).cmdExists},
	{name: "del", arity: -2, flags: flagWrite, counted: cmdDel, run: (*Server).cmdDel},
	{name: "unlink", arity: -2, flags: flagWrite, counted: cmdDel, run: (*Server).cmdDel},
	{name: "mget", arity: -2, flags: flagReadOnly, counted: cmdMget, run: (*Server).cmdMget},
	{name: "mset", arity: -3, flags: flagWrite | flagPairs, counted: cmdMset, run: (*Server).cmdMset},
	{name: "expire", arity: -3, flags: flagWrite, counted: cmdExpire, run: (*Server).cmdExpire},
	{name: "pexpire", arity: -3, flags: flagWrite, counted: cmdExpire, run: (*Server).cmdPExpire},
	{name: "persist", arity: 2, flags: flagWrite, counted: notCounted, run: (*Server).cmdPersist},
	{name: "ttl", arity: 2, flags: flagReadOnly, counted: notCounted, run: (*Server).cmdTTL},
	{name: "pttl", arity: 2, flags: flagReadOnly, counted: notCounted, run: (*Server).cmdPTTL},
	{name: "type", arity: 2, flags: flagReadOnly, counted: notCounted, run: (*Server).cmdType},
	{name: "scan", arity: -2, flags: flagReadOnly, counted: notCounted, run: (*Server).cmdScan},
	{name: "keys", arity: 2, flags: flagReadOnly, counted: notCounted, run: (*Server).cmdKeys},
	{name: "dbsize", arity: -1, flags: flagReadOnly, counted: notCounted, run: (*Server).cmdDBSize},
	{name: "flushall", arity: -1, flags: flagWrite, counted: notCounted, run: (*Server).cmdFlushAll},
	{name: "flushdb", arity: -1, flags: flagWrite, counted: notCounted, run: (*Server).cmdFlushAll},
	{name: "ping", arity: -1, counted: notCounted, run: (*Server).cmdPing},
	{name: "echo", arity: 2, counted: notCounted, run: (*Server).cmdEcho},
	{name: "select", arity: 2, counted: notCounted, run: (*Server).cmdSelect},
	{name: "info", arity: -1, counted: notCounted, run: (*Server).cmdInfo},
	{name: "config", arity: -2, counted: notCounted, run: (*Server).cmdConfig},
	{name: "client", arity: -2, counted: notCounted, run: (*Server).cmdClient},
	{name: "command", arity: -1, counted: notCounted, run: (*Server).cmdCommand},
	{name: "auth", arity: -2, flags: flagNoAuth, counted: notCounted, run: (*Server).cmdAuth},
	{name: "hello", arity: -1, flags: flagNoAuth, counted: notCounted, run: (*Server).cmdHello},
	{name: "quit", arity: -1, flags: flagNoAuth, counted: notCounted, run: (*Server).cmdQuit},
	{name: "reset", arity: -1, counted: notCounted, run: (*Server).cmdReset},
})

func commandsByName(cmds []*command) map[string]*command {
	m := make(map[string]*command, len(cmds))
	for _, c := range cmds {
		m[strings.ToUpper(c.name)] = c
	}
	return m
}

// maxCommandName bounds the names looked up in the table: no command is
// longer, and a longer name is refused before it is copied.
const maxCommandName = 32

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

// lookup finds a command by the name a client sent, in any case; nil if
// there is none.
func lookup(name []byte) *command {
	switch getOrSet(name) {
	case "GET":
		return getCommand
	case "SET":
		return setCommand
	}
	var buf [maxCommandName]byte
	return commandTable[string(upper(buf[:], name))]
}

// takes reports whether the command takes n arguments, its name included.
func (cmd *command) takes(n int) bool {
	if cmd.arity > 0 {
		return n == cmd.arity
	}
	return n >= -cmd.arity && (cmd.flags&flagPairs == 0 || n%2 == 1)
}

// argErr replies that a command (its lower-case name, with the subcommand
// after a '|') got the wrong number of arguments.
func (s *Server) argErr(c *conn, name string) {
	s.mErrors.WithLabelValues("args").Inc()
	c.w.Error("ERR wrong number of arguments for '" + name + "' command")
}

// dispatch runs one command. Before authentication only flagNoAuth
// commands run and every other name, known or not, gets NOAUTH, as Redis
// answers.
func (s *Server) dispatch(ctx context.Context, c *conn, args [][]byte) {
	name := args[0]
	if len(name) > maxCommandName {
		s.mErrors.WithLabelValues("unknown").Inc()
		c.w.Error("ERR unknown command")
		return
	}
	cmd := lookup(name)
	if !c.authed && (cmd == nil || cmd.flags&flagNoAuth == 0) {
		s.mErrors.WithLabelValues("auth").Inc()
		c.w.Error("NOAUTH Authentication required.")
		return
	}
	if cmd == nil {
		s.mErrors.WithLabelValues("unknown").Inc()
		c.w.Error(fmt.Sprintf("ERR unknown command '%s', with args beginning with: ", truncate(string(name), 64)))
		return
	}
	if !cmd.takes(len(args)) {
		s.argErr(c, cmd.name)
		return
	}
	if cmd.counted != notCounted {
		c.counted[cmd.counted]++
	}
	cmd.run(s, ctx, c, args)
}

func (s *Server) cmdGet(ctx context.Context, c *conn, args [][]byte) {
	// Borrowed: a large reply is written out before Bulk returns (a small
	// one copied), so the value can go back at once.
	if v, loan, _, ok := s.st.Borrow(ctx, string(args[1])); ok {
		c.w.Bulk(v)
		s.st.Release(loan)
	} else {
		c.w.Null()
	}
}

func (s *Server) cmdExists(ctx context.Context, c *conn, args [][]byte) {
	var n int64
	for _, k := range args[1:] {
		if s.st.Exists(ctx, string(k)) {
			n++
		}
	}
	c.w.Int(n)
}

// cmdDel serves DEL and UNLINK, which are the same here: the store frees
// values without blocking the connection.
func (s *Server) cmdDel(_ context.Context, c *conn, args [][]byte) {
	var n int64
	for _, k := range args[1:] {
		if s.st.Delete(string(k)) {
			n++
		}
	}
	c.w.Int(n)
}

func (s *Server) cmdMget(ctx context.Context, c *conn, args [][]byte) {
	c.w.Array(len(args) - 1)
	for _, k := range args[1:] {
		if v, loan, _, ok := s.st.Borrow(ctx, string(k)); ok {
			c.w.Bulk(v)
			s.st.Release(loan)
		} else {
			c.w.Null()
		}
	}
}

// cmdMset checks every value's size before it stores any, so that a
// refused MSET changes nothing.
func (s *Server) cmdMset(_ context.Context, c *conn, args [][]byte) {
	n := len(args)
	for i := 1; i < n; i += 2 {
		if int64(len(args[i+1])) > s.st.MaxValue() {
			s.mErrors.WithLabelValues("too_large").Inc()
			c.w.Error(fmt.Sprintf("ERR value of %d bytes exceeds the %d-byte limit", len(args[i+1]), s.st.MaxValue()))
			return
		}
	}
	for i := 1; i < n; i += 2 {
		if _, err := s.st.Set(string(args[i]), own(args[i+1]), 0, store.SetAlways); err != nil {
			c.w.Error("ERR " + err.Error())
			return
		}
	}
	c.w.OK()
}

func (s *Server) cmdPing(_ context.Context, c *conn, args [][]byte) {
	switch len(args) {
	case 1:
		c.w.Simple("PONG")
	case 2:
		c.w.Bulk(args[1])
	default:
		s.argErr(c, "ping")
	}
}

func (s *Server) cmdEcho(_ context.Context, c *conn, args [][]byte) {
	c.w.Bulk(args[1])
}

func (s *Server) cmdExpire(_ context.Context, c *conn, args [][]byte) {
	s.expire(c, args, "expire", time.Second)
}

func (s *Server) cmdPExpire(_ context.Context, c *conn, args [][]byte) {
	s.expire(c, args, "pexpire", time.Millisecond)
}

// expire serves EXPIRE and PEXPIRE, whose time is in units of unit.
func (s *Server) expire(c *conn, args [][]byte, name string, unit time.Duration) {
	w := c.w
	d, err := strconv.ParseInt(string(args[2]), 10, 64)
	if err != nil {
		w.Error("ERR value is not an integer or out of range")
		return
	}
	if d > int64(1<<62)/int64(unit) || d < -int64(1<<62)/int64(unit) {
		w.Error("ERR invalid expire time in '" + name + "' command")
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
}

func (s *Server) cmdPersist(_ context.Context, c *conn, args [][]byte) {
	at, ok := s.st.ExpireAt(string(args[1]))
	if ok && at != 0 && s.st.Expire(string(args[1]), 0) {
		c.w.Int(1)
	} else {
		c.w.Int(0)
	}
}

func (s *Server) cmdTTL(_ context.Context, c *conn, args [][]byte) {
	s.ttl(c, args, func(left time.Duration) int64 { return int64((left + time.Second/2) / time.Second) })
}

func (s *Server) cmdPTTL(_ context.Context, c *conn, args [][]byte) {
	s.ttl(c, args, time.Duration.Milliseconds)
}

// ttl serves TTL and PTTL, which reply with the time left in the unit
// inUnit converts it to.
func (s *Server) ttl(c *conn, args [][]byte, inUnit func(time.Duration) int64) {
	at, ok := s.st.ExpireAt(string(args[1]))
	switch {
	case !ok:
		c.w.Int(-2)
	case at == 0:
		c.w.Int(-1)
	default:
		c.w.Int(inUnit(time.Until(time.Unix(0, at))))
	}
}

func (s *Server) cmdType(_ context.Context, c *conn, args [][]byte) {
	if _, ok := s.st.ExpireAt(string(args[1])); ok {
		c.w.Simple("string")
	} else {
		c.w.Simple("none")
	}
}

func (s *Server) cmdKeys(_ context.Context, c *conn, args [][]byte) {
	pat := args[1]
	var out []string
	for _, k := range s.st.Keys() {
		if globMatch(pat, []byte(k)) {
			out = append(out, k)
		}
	}
	c.w.Array(len(out))
	for _, k := range out {
		c.w.BulkString(k)
	}
}

func (s *Server) cmdDBSize(_ context.Context, c *conn, _ [][]byte) {
	c.w.Int(int64(s.st.Len()))
}

// cmdFlushAll serves FLUSHALL and FLUSHDB: there is one database.
func (s *Server) cmdFlushAll(_ context.Context, c *conn, _ [][]byte) {
	for _, k := range s.st.Keys() {
		s.st.Delete(k)
	}
	c.w.OK()
}

func (s *Server) cmdInfo(_ context.Context, c *conn, args [][]byte) {
	s.publish(c) // count what this connection ran before INFO
	section := ""
	if len(args) > 1 {
		section = strings.ToLower(string(args[1]))
	}
	c.w.Verbatim(s.info(section))
}

func (s *Server) cmdSelect(_ context.Context, c *conn, args [][]byte) {
	if string(args[1]) == "0" {
		c.w.OK()
	} else {
		c.w.Error("ERR DB index is out of range")
	}
}

// cmdCommand answers redis-cli, which asks for command docs to drive its
// hints: an empty reply makes it fall back to its built-in table.
func (s *Server) cmdCommand(_ context.Context, c *conn, args [][]byte) {
	if len(args) > 1 && strings.EqualFold(string(args[1]), "COUNT") {
		c.w.Int(0)
		return
	}
	c.w.Array(0)
}

func (s *Server) cmdQuit(_ context.Context, c *conn, _ [][]byte) {
	c.w.OK()
	c.quit = true
}

func (s *Server) cmdReset(_ context.Context, c *conn, _ [][]byte) {
	c.w.SetProtocol(2)
	c.name = ""
	c.authed = s.passHash.Load() == nil
	c.w.Simple("RESET")
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

func (s *Server) cmdScan(_ context.Context, c *conn, args [][]byte) {
	w := c.w
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
	want := s.passHash.Load()
	if want == nil {
		return false
	}
	h := sha256.Sum256(pass)
	return subtle.ConstantTimeCompare(h[:], *want) == 1
}

func (s *Server) cmdAuth(_ context.Context, c *conn, args [][]byte) {
	w := c.w
	var user, pass []byte
	switch len(args) {
	case 2:
		pass = args[1]
	case 3:
		user, pass = args[1], args[2]
	default:
		s.argErr(c, "auth")
		return
	}
	if s.passHash.Load() == nil {
		s.mErrors.WithLabelValues("auth").Inc()
		w.Error("ERR AUTH <password> called without any password configured for the default user. Are you sure your configuration is correct?")
		return
	}
	if (user != nil && string(user) != "default") || !s.checkPassword(pass) {
		s.authFailed(c)
		return
	}
	c.authed = true
	w.OK()
}

// authFailed answers a wrong password or user: after AuthFailureDelay, with
// WRONGPASS, and the MaxAuthFailures-th failure of a connection closes it.
// Redis itself neither delays nor closes (it relies on long passwords and
// logs failures in ACL LOG); a connection that guesses gets a few tries at
// a slow pace here, and a client that retries a wrong password from
// configuration reconnects every MaxAuthFailures attempts.
func (s *Server) authFailed(c *conn) {
	s.mErrors.WithLabelValues("auth").Inc()
	s.mAuthFail.Inc()
	c.authFails++
	if s.cfg.AuthFailureDelay > 0 {
		time.Sleep(s.cfg.AuthFailureDelay)
	}
	c.w.Error("WRONGPASS invalid username-password pair or user is disabled.")
	if s.cfg.MaxAuthFailures > 0 && c.authFails >= s.cfg.MaxAuthFailures {
		s.mClosed.WithLabelValues(closedAuthFailures).Inc()
		s.log.Warn("closing a connection after failed AUTH attempts", "client", c.id, "remote", c.nc.RemoteAddr().String(), "failures", c.authFails)
		c.quit = true
	}
}

func (s *Server) cmdHello(_ context.Context, c *conn, args [][]byte) {
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
				s.authFailed(c)
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

func (s *Server) cmdClient(_ context.Context, c *conn, args [][]byte) {
	w := c.w
	switch strings.ToUpper(string(args[1])) {
	case "SETNAME":
		if len(args) != 3 {
			s.argErr(c, "client|setname")
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
func (s *Server) cmdConfig(_ context.Context, c *conn, args [][]byte) {
	w := c.w
	switch strings.ToUpper(string(args[1])) {
	case "GET":
		if len(args) < 3 {
			s.argErr(c, "config|get")
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
