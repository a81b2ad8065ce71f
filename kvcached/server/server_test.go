package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/kvcached/store"
)

func start(t *testing.T, password string, maxValue int64) (string, *store.Store) {
	t.Helper()
	return startStore(t, password, store.Config{RAMBytes: 64 << 20, DiskBytes: 64 << 20, MaxValue: maxValue})
}

// startStore serves a store opened with cfg (its Dir and Metrics filled in).
func startStore(t *testing.T, password string, cfg store.Config) (string, *store.Store) {
	t.Helper()
	return serve(t, Config{Password: password}, cfg)
}

// serve runs a server with cfg over a store opened with scfg (both with
// metrics on a registry of their own) until the test ends.
func serve(t *testing.T, cfg Config, scfg store.Config) (string, *store.Store) {
	t.Helper()
	addr, _, st := serveServer(t, cfg, scfg)
	return addr, st
}

// serveServer is serve returning the Server too, for a test that waits on
// its state.
func serveServer(t *testing.T, cfg Config, scfg store.Config) (string, *Server, *store.Store) {
	t.Helper()
	reg := prometheus.NewRegistry()
	scfg.Dir, scfg.Metrics = t.TempDir(), store.NewMetrics(reg)
	st, err := store.Open(scfg)
	must.NoError(t, err)
	cfg.Store, cfg.Registerer = st, reg
	srv, err := New(cfg)
	must.NoError(t, err)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	go srv.Serve(l)
	t.Cleanup(func() {
		srv.Close()
		st.Close()
	})
	return l.Addr().String(), srv, st
}

func TestGoRedisCommands(t *testing.T) {
	addr, _ := start(t, "", 1<<20)
	for _, proto := range []int{2, 3} {
		t.Run(fmt.Sprintf("RESP%d", proto), func(t *testing.T) {
			ctx := context.Background()
			c := redis.NewClient(&redis.Options{Addr: addr, Protocol: proto, ClientName: "test"})
			defer c.Close()
			must.NoError(t, c.FlushAll(ctx).Err())
			must.Eq(t, "PONG", c.Ping(ctx).Val())
			must.NoError(t, c.Set(ctx, "k", "v", 0).Err())
			must.Eq(t, "v", c.Get(ctx, "k").Val())
			_, err := c.Get(ctx, "missing").Result()
			must.ErrorIs(t, err, redis.Nil)

			ok, err := c.SetNX(ctx, "k", "other", 0).Result()
			must.NoError(t, err)
			must.False(t, ok)
			ok, err = c.SetXX(ctx, "nx", "v", 0).Result()
			must.NoError(t, err)
			must.False(t, ok)
			must.NoError(t, c.Set(ctx, "ex", "v", 100*time.Second).Err())
			ttl := c.TTL(ctx, "ex").Val()
			must.Between(t, 99*time.Second, ttl, 100*time.Second)
			must.NoError(t, c.Set(ctx, "px", "v", 50*time.Millisecond).Err())
			time.Sleep(80 * time.Millisecond) // the input: past the 50 ms PX expiry
			must.Eq(t, int64(0), c.Exists(ctx, "px").Val())
			must.Eq(t, time.Duration(-1), c.TTL(ctx, "k").Val())
			must.Eq(t, time.Duration(-2), c.TTL(ctx, "missing").Val())
			must.True(t, c.Expire(ctx, "k", time.Hour).Val())
			must.False(t, c.Expire(ctx, "missing", time.Hour).Val())

			must.NoError(t, c.MSet(ctx, "a", "1", "b", "2").Err())
			must.Eq(t, []any{"1", "2", nil}, c.MGet(ctx, "a", "b", "zz").Val())
			must.Eq(t, int64(2), c.Exists(ctx, "a", "b", "zz").Val())
			must.Eq(t, int64(5), c.DBSize(ctx).Val())
			must.Eq(t, int64(2), c.Del(ctx, "a", "b", "zz").Val())

			// SCAN with MATCH over more keys than one page.
			for i := 0; i < 40; i++ {
				must.NoError(t, c.Set(ctx, fmt.Sprintf("scan:%d", i), "x", 0).Err())
			}
			var all []string
			iter := c.Scan(ctx, 0, "scan:*", 7).Iterator()
			for iter.Next(ctx) {
				all = append(all, iter.Val())
			}
			must.NoError(t, iter.Err())
			must.SliceLen(t, 40, all)

			info := c.Info(ctx).Val()
			must.StrContains(t, info, "redis_version:")
			must.StrContains(t, info, "# Kvcached")
			cfg := c.ConfigGet(ctx, "save").Val()
			must.Eq(t, map[string]string{"save": ""}, cfg)
			must.NoError(t, c.Do(ctx, "SELECT", "0").Err())
			must.ErrorContains(t, c.Do(ctx, "SELECT", "1").Err(), "out of range")
			must.ErrorContains(t, c.Do(ctx, "NOSUCHCMD").Err(), "unknown command")
			must.ErrorContains(t, c.Do(ctx, "GET").Err(), "wrong number of arguments")

			// Binary values and pipelining.
			bin := string([]byte{0, '\r', '\n', 0xff})
			pipe := c.Pipeline()
			for i := 0; i < 100; i++ {
				pipe.Set(ctx, fmt.Sprintf("p%d", i), bin, 0)
			}
			gets := make([]*redis.StringCmd, 100)
			for i := range gets {
				gets[i] = pipe.Get(ctx, fmt.Sprintf("p%d", i))
			}
			_, err = pipe.Exec(ctx)
			must.NoError(t, err)
			for _, g := range gets {
				must.Eq(t, bin, g.Val())
			}
		})
	}
}

// TestLMCacheConnectorCalls replays what LMCache's RedisConnector sends for
// one chunk: SET kv_bytes, SET metadata, EXISTS metadata, GET both, DEL.
func TestLMCacheConnectorCalls(t *testing.T) {
	addr, _ := start(t, "", 64<<20)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 150})
	defer c.Close()
	k := "meta-llama/Llama-3.1-8B-Instruct@1@0@7f3a9c@bfloat16"
	kv := strings.Repeat("\x01\x02", 16<<20) // 32 MiB, a 256-token Llama-3-8B chunk
	meta := strings.Repeat("m", 28)
	must.NoError(t, c.Set(ctx, k+"kv_bytes", kv, 0).Err())
	must.NoError(t, c.Set(ctx, k+"metadata", meta, 0).Err())
	must.Eq(t, int64(1), c.Exists(ctx, k+"metadata").Val())
	must.Eq(t, meta, c.Get(ctx, k+"metadata").Val())
	got := c.Get(ctx, k+"kv_bytes").Val()
	must.True(t, got == kv)
	must.Eq(t, int64(1), c.Del(ctx, k+"metadata").Val())
	must.Eq(t, int64(0), c.Exists(ctx, k+"metadata").Val())
}

func TestValueOverLimitIsAnError(t *testing.T) {
	addr, _ := start(t, "", 1<<20)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer c.Close()
	err := c.Set(ctx, "big", strings.Repeat("x", 2<<20), 0).Err()
	must.ErrorContains(t, err, "exceeds")
	// The connection stays usable.
	must.NoError(t, c.Set(ctx, "small", "x", 0).Err())
	must.Eq(t, "x", c.Get(ctx, "small").Val())
	must.Eq(t, int64(0), c.Exists(ctx, "big").Val())
}

func TestAuth(t *testing.T) {
	addr, _ := start(t, "s3cret", 1<<20)
	ctx := context.Background()
	anon := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer anon.Close()
	must.ErrorContains(t, anon.Get(ctx, "k").Err(), "NOAUTH")

	wrong := redis.NewClient(&redis.Options{Addr: addr, Password: "nope"})
	defer wrong.Close()
	must.ErrorContains(t, wrong.Ping(ctx).Err(), "WRONGPASS")

	for _, proto := range []int{2, 3} {
		good := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret", Protocol: proto})
		must.NoError(t, good.Set(ctx, "k", "v", 0).Err())
		must.Eq(t, "v", good.Get(ctx, "k").Val())
		good.Close()
	}
}

func TestAuthWithoutPasswordConfigured(t *testing.T) {
	addr, _ := start(t, "", 1<<20)
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	must.ErrorContains(t, c.Do(context.Background(), "AUTH", "x").Err(), "without any password configured")
}

func TestMalformedInputGetsErrorAndClose(t *testing.T) {
	addr, _ := start(t, "", 1<<20)
	cases := []struct{ name, in, want string }{
		{"bad bulk prefix", "*1\r\n+PING\r\n", "-ERR Protocol error: expected '$'"},
		{"bad length", "*1\r\n$abc\r\n", "-ERR Protocol error: invalid length"},
		{"unbalanced quotes", "SET \"a\r\n", "-ERR Protocol error: unbalanced quotes"},
		{"huge multibulk", "*99999999999\r\n", "-ERR Protocol error: invalid multibulk length"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			must.NoError(t, err)
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Second))
			_, err = c.Write([]byte(tc.in))
			must.NoError(t, err)
			r := bufio.NewReader(c)
			line, err := r.ReadString('\n')
			must.NoError(t, err)
			must.StrHasPrefix(t, tc.want, line)
			_, err = r.ReadByte()
			must.ErrorIs(t, err, io.EOF) // closed: the stream cannot be resynced
		})
	}
	// Oversized bulk in a raw pipeline: error for it, the next command works.
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	big := strings.Repeat("x", 2<<20)
	fmt.Fprintf(c, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n%s\r\n*1\r\n$4\r\nPING\r\n", len(big), big)
	r := bufio.NewReader(c)
	l1, _ := r.ReadString('\n')
	l2, _ := r.ReadString('\n')
	must.StrContains(t, l1, "exceeds")
	must.Eq(t, "+PONG\r\n", l2)
}

// A large value trickling in, then a command written a byte at a time: the
// reader, which raises the socket's receive low-water mark (SO_RCVLOWAT) for
// large values, must assemble both. A mark set once to the value's length and
// not lowered as pieces are consumed waits for bytes the client will never
// send: a first version did, and this test hung.
func TestLargeValueArrivingInPieces(t *testing.T) {
	addr, _ := start(t, "", 4<<20)
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	val := []byte(strings.Repeat("0123456789abcdef", (1<<20)/16))
	_, err = fmt.Fprintf(c, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n", len(val))
	must.NoError(t, err)
	for off := 0; off < len(val); off += 200_000 {
		_, err = c.Write(val[off:min(off+200_000, len(val))])
		must.NoError(t, err)
		time.Sleep(20 * time.Millisecond) // the input: a client sending its value slowly
	}
	_, err = c.Write([]byte("\r\n"))
	must.NoError(t, err)
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, "+OK\r\n", line)
	// One byte at a time, after the large value: answered, not held back.
	for _, b := range []byte("*1\r\n$4\r\nPING\r\n") {
		_, err = c.Write([]byte{b})
		must.NoError(t, err)
	}
	line, err = r.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, "+PONG\r\n", line)
	_, err = fmt.Fprint(c, "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n")
	must.NoError(t, err)
	line, err = r.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, fmt.Sprintf("$%d\r\n", len(val)), line)
	got := make([]byte, len(val)+2)
	_, err = io.ReadFull(r, got)
	must.NoError(t, err)
	must.Eq(t, string(val), string(got[:len(val)]))
}

func TestRedisCLI(t *testing.T) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("redis-cli not installed (Debian package redis-tools; make deps installs it)")
		}
		t.Skip("redis-cli not installed (Debian package redis-tools)")
	}
	addr, _ := start(t, "pw", 1<<20)
	host, port, _ := net.SplitHostPort(addr)
	run := func(args ...string) string {
		t.Helper()
		full := append([]string{"-h", host, "-p", port, "-a", "pw", "--no-auth-warning"}, args...)
		out, err := exec.Command(cli, full...).CombinedOutput()
		must.NoError(t, err, must.Sprint(string(out)))
		return strings.TrimSpace(string(out))
	}
	must.Eq(t, "PONG", run("PING"))
	must.Eq(t, "OK", run("SET", "greeting", "hello world"))
	must.Eq(t, "hello world", run("GET", "greeting"))
	must.Eq(t, "OK", run("SET", "t", "1", "EX", "500"))
	must.Eq(t, "500", run("TTL", "t"))
	must.Eq(t, "2", run("EXISTS", "greeting", "t"))
	must.Eq(t, "2", run("DBSIZE"))
	must.Eq(t, "greeting\nt", sortLines(run("--scan")))
	must.StrContains(t, run("INFO", "server"), "redis_version:")
	must.StrContains(t, run("-3", "HELLO", "3"), "proto 3")
	must.StrContains(t, run("BOGUS"), "ERR unknown command")
	// Pipe mode: redis-cli --pipe sends raw RESP and checks every reply.
	cmd := exec.Command(cli, "-h", host, "-p", port, "-a", "pw", "--no-auth-warning", "--pipe")
	var in strings.Builder
	for i := 0; i < 1000; i++ {
		fmt.Fprintf(&in, "*3\r\n$3\r\nSET\r\n$%d\r\nk%d\r\n$1\r\nv\r\n", len(fmt.Sprint(i))+1, i)
	}
	cmd.Stdin = strings.NewReader(in.String())
	out, err := cmd.CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "errors: 0, replies: 1000")
	must.Eq(t, "1002", run("DBSIZE"))
	// Wrong password.
	out, _ = exec.Command(cli, "-h", host, "-p", port, "-a", "bad", "--no-auth-warning", "GET", "greeting").CombinedOutput()
	must.StrContains(t, string(out), "WRONGPASS")
}

func sortLines(s string) string {
	l := strings.Split(s, "\n")
	for i := range l {
		for j := i + 1; j < len(l); j++ {
			if l[j] < l[i] {
				l[i], l[j] = l[j], l[i]
			}
		}
	}
	return strings.Join(l, "\n")
}

func TestGlobMatch(t *testing.T) {
	cases := []struct {
		p, s string
		want bool
	}{
		{"*", "", true}, {"a*", "abc", true}, {"a?c", "abc", true}, {"a?c", "ac", false},
		{"h[ae]llo", "hello", true}, {"h[^e]llo", "hello", false}, {"h[a-b]llo", "hbllo", true},
		{"a\\*", "a*", true}, {"a\\*", "ab", false}, {"*kv_bytes", "m@1@0@ab@halfkv_bytes", true},
		{"[", "[", true}, {"x*y*z", "xaaybbz", true}, {"x*y*z", "xaaybb", false},
	}
	for _, tc := range cases {
		must.Eq(t, tc.want, globMatch([]byte(tc.p), []byte(tc.s)), must.Sprintf("%q %q", tc.p, tc.s))
	}
}

func TestGetOrSetRecognisesOnlyGetAndSet(t *testing.T) {
	for name, want := range map[string]string{
		"GET": "GET", "get": "GET", "gEt": "GET", "SET": "SET", "set": "SET", "sEt": "SET",
		"GETS": "", "GE": "", "gex": "", "bet": "", "s\x05t": "", "GET\x00": "", "": "", "GeT ": "",
	} {
		must.Eq(t, want, getOrSet([]byte(name)), must.Sprintf("%q", name))
	}
}

// startPooled is start with the store's buffer pool on.
func startPooled(t *testing.T) string {
	t.Helper()
	addr, _ := startStore(t, "", store.Config{RAMBytes: 128 << 20, DiskBytes: 64 << 20, MaxValue: 32 << 20, PoolBytes: 64 << 20})
	return addr
}

// A GET reply still being written to a client that reads slowly keeps its
// value, while the key is overwritten with values of the same size (which
// the pool would hand the overwritten value's buffer to, were it given back
// before the reply was out).
func TestSlowReaderKeepsItsValue(t *testing.T) {
	addr := startPooled(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	const size = 16 << 20 // more than the sockets' buffers take at once
	must.NoError(t, c.Set(ctx, "k", strings.Repeat("a", size), 0).Err())

	slow, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer slow.Close()
	must.NoError(t, slow.(*net.TCPConn).SetReadBuffer(64<<10))
	_, err = slow.Write([]byte("*2\r\n$3\r\nGET\r\n$1\r\nk\r\n"))
	must.NoError(t, err)
	// The reply's head arrived: the server holds the value and is stuck
	// writing the rest of it.
	br := bufio.NewReader(slow)
	head, err := br.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, fmt.Sprintf("$%d\r\n", size), head)
	for _, b := range "bcd" {
		must.NoError(t, c.Set(ctx, "k", strings.Repeat(string(b), size), 0).Err())
	}
	got := make([]byte, size)
	_, err = io.ReadFull(br, got)
	must.NoError(t, err)
	must.Eq(t, size, strings.Count(string(got), "a"), must.Sprint("the reply changed while it was written"))
}

// Values rewritten while GET, MGET and SET ... GET replies carry them reach
// the client whole: every byte of a value names the write that made it.
func TestRepliesSurviveBufferReuse(t *testing.T) {
	addr := startPooled(t)
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 8})
	defer c.Close()
	keys := []string{"a", "b", "c"}
	whole := func(v string) bool { return len(v) == 64<<10 && strings.Count(v, v[:1]) == len(v) }
	var bad atomic.Int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 2; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := strings.Repeat(string(rune('A'+(i*2+w)%26)), 64<<10)
				if i%7 == 0 {
					// SET ... GET replies with the value it replaces.
					if old, err := c.SetArgs(ctx, keys[i%3], v, redis.SetArgs{Get: true}).Result(); err == nil && !whole(old) {
						bad.Add(1)
					}
					continue
				}
				must.NoError(t, c.Set(ctx, keys[i%3], v, 0).Err())
			}
		}(w)
	}
	for i := 0; i < 400; i++ {
		if v, err := c.Get(ctx, keys[i%3]).Result(); err == nil && !whole(v) {
			bad.Add(1)
		}
		for _, v := range c.MGet(ctx, keys...).Val() {
			if s, ok := v.(string); ok && !whole(s) {
				bad.Add(1)
			}
		}
	}
	close(stop)
	wg.Wait()
	must.Eq(t, int64(0), bad.Load())
}

// Errors for unknown commands, wrong arities and unauthenticated clients
// are Redis's, to the byte: clients match on their text.
func TestErrorReplies(t *testing.T) {
	addr, _ := start(t, "pw", 1<<20)
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	send := func(args ...string) string {
		t.Helper()
		fmt.Fprintf(c, "*%d\r\n", len(args))
		for _, a := range args {
			fmt.Fprintf(c, "$%d\r\n%s\r\n", len(a), a)
		}
		line, err := r.ReadString('\n')
		must.NoError(t, err)
		return line
	}
	must.Eq(t, "-NOAUTH Authentication required.\r\n", send("GET", "k"))
	must.Eq(t, "-NOAUTH Authentication required.\r\n", send("nosuch"))
	must.Eq(t, "-ERR unknown command\r\n", send(strings.Repeat("x", 33)))
	must.Eq(t, "-ERR wrong number of arguments for 'auth' command\r\n", send("AUTH"))
	must.Eq(t, "+OK\r\n", send("AUTH", "pw"))
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nosuch", "a"}, "-ERR unknown command 'nosuch', with args beginning with: \r\n"},
		{[]string{strings.Repeat("y", 32)}, "-ERR unknown command '" + strings.Repeat("y", 32) + "', with args beginning with: \r\n"},
		{[]string{strings.Repeat("y", 33)}, "-ERR unknown command\r\n"},
		{[]string{"gEt"}, "-ERR wrong number of arguments for 'get' command\r\n"},
		{[]string{"SET", "k"}, "-ERR wrong number of arguments for 'set' command\r\n"},
		{[]string{"UNLINK"}, "-ERR wrong number of arguments for 'unlink' command\r\n"},
		{[]string{"MSET", "a", "1", "b"}, "-ERR wrong number of arguments for 'mset' command\r\n"},
		{[]string{"PEXPIRE", "k"}, "-ERR wrong number of arguments for 'pexpire' command\r\n"},
		{[]string{"PING", "a", "b"}, "-ERR wrong number of arguments for 'ping' command\r\n"},
		{[]string{"TTL", "a", "b"}, "-ERR wrong number of arguments for 'ttl' command\r\n"},
		{[]string{"CLIENT", "SETNAME"}, "-ERR wrong number of arguments for 'client|setname' command\r\n"},
		{[]string{"CONFIG", "GET"}, "-ERR wrong number of arguments for 'config|get' command\r\n"},
		{[]string{"PEXPIRE", "k", "99999999999999999"}, "-ERR invalid expire time in 'pexpire' command\r\n"},
		{[]string{"DBSIZE", "extra"}, ":0\r\n"},
	} {
		must.Eq(t, tc.want, send(tc.args...), must.Sprint(tc.args))
	}
}

// startConfig serves a RAM-only store with cfg (its Store filled in).
func startConfig(t *testing.T, cfg Config) string {
	t.Helper()
	addr, _ := serve(t, cfg, store.Config{RAMBytes: 64 << 20, MaxValue: 1 << 20})
	return addr
}

// rawReply writes in on a new connection and returns the first reply line
// and whether the server then closed the connection.
func rawReply(t *testing.T, addr, in string) (string, bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	_, err = c.Write([]byte(in))
	must.NoError(t, err)
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	must.NoError(t, err)
	_, err = r.ReadByte()
	// EOF, or a reset when the server closed with our input unread.
	var ne net.Error
	return line, err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// Before AUTH a client may send only Redis's unauthenticated sizes: more
// than 10 arguments or a bulk over 16384 bytes is a protocol error that
// closes the connection; after AUTH the limits are lifted, within the same
// pipeline.
func TestUnauthenticatedLimits(t *testing.T) {
	addr := startConfig(t, Config{Password: "s3cret"})
	for _, tc := range []struct{ name, in, want string }{
		{"multibulk", "*11\r\n", "-ERR Protocol error: unauthenticated multibulk length\r\n"},
		{"bulk", "*1\r\n$16385\r\n", "-ERR Protocol error: unauthenticated bulk length\r\n"},
		{"bulk in a known command", "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$100000\r\n", "-ERR Protocol error: unauthenticated bulk length\r\n"},
		{"inline", "PING 1 2 3 4 5 6 7 8 9 10\r\n", "-ERR Protocol error: unauthenticated multibulk length\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			line, closed := rawReply(t, addr, tc.in)
			must.Eq(t, tc.want, line)
			must.True(t, closed)
		})
	}
	// Within the limits an unauthenticated command gets NOAUTH and the
	// connection stays open; AUTH lifts the limits for the next command.
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	big := strings.Repeat("v", 100000)
	fmt.Fprintf(c, "*2\r\n$3\r\nGET\r\n$1\r\nk\r\n*2\r\n$4\r\nAUTH\r\n$6\r\ns3cret\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$%d\r\n%s\r\n", len(big), big)
	r := bufio.NewReader(c)
	for _, want := range []string{"-NOAUTH Authentication required.\r\n", "+OK\r\n", "+OK\r\n"} {
		line, err := r.ReadString('\n')
		must.NoError(t, err)
		must.Eq(t, want, line)
	}

	ctx := context.Background()
	anon := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
	defer anon.Close()
	must.ErrorContains(t, anon.MSet(ctx, "a", 1, "b", 2, "c", 3, "d", 4, "e", 5, "f", 6).Err(), "unauthenticated multibulk length")
	good := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret"})
	defer good.Close()
	must.NoError(t, good.MSet(ctx, "a", 1, "b", 2, "c", 3, "d", 4, "e", 5, "f", 6).Err())
	must.NoError(t, good.Set(ctx, "big", big, 0).Err())
	must.Eq(t, big, good.Get(ctx, "big").Val())
}

// A bulk length past Redis's proto-max-bulk-len is not skipped: it closes
// the connection, authenticated or not.
func TestHugeBulkLengthClosesTheConnection(t *testing.T) {
	addr := startConfig(t, Config{})
	line, closed := rawReply(t, addr, "*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$600000000\r\n")
	must.Eq(t, "-ERR Protocol error: invalid bulk length 600000000\r\n", line)
	must.True(t, closed)
}

// A connection that does not authenticate within AuthTimeout is closed;
// one that did stays open past it.
func TestAuthTimeout(t *testing.T) {
	addr := startConfig(t, Config{Password: "s3cret", AuthTimeout: 200 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	// Commands that do not authenticate do not extend it.
	start := time.Now()
	for i := 0; i < 5; i++ {
		fmt.Fprintf(c, "PING\r\n")
		time.Sleep(50 * time.Millisecond) // the input: unauthenticated commands spread past AuthTimeout
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(c)
	// EOF, or a reset when a PING arrived after the close: closed by the
	// server, not by our deadline.
	var ne net.Error
	must.False(t, errors.As(err, &ne) && ne.Timeout())
	must.Less(t, 3*time.Second, time.Since(start))

	good := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret", PoolSize: 1})
	defer good.Close()
	ctx := context.Background()
	must.NoError(t, good.Ping(ctx).Err())
	time.Sleep(400 * time.Millisecond) // the input: past AuthTimeout, which must not close an authenticated client
	var id1, id2 int64
	id1 = good.ClientID(ctx).Val()
	must.NoError(t, good.Ping(ctx).Err())
	id2 = good.ClientID(ctx).Val()
	must.Eq(t, id1, id2)
}

// Idle connections are closed after IdleTimeout, so connections left open
// cannot hold every MaxClients slot.
func TestIdleConnectionsCannotExhaustMaxClients(t *testing.T) {
	addr, srv, _ := serveServer(t, Config{MaxClients: 3, IdleTimeout: 300 * time.Millisecond},
		store.Config{RAMBytes: 64 << 20, MaxValue: 1 << 20})
	var idle []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", addr)
		must.NoError(t, err)
		defer c.Close()
		idle = append(idle, c)
	}
	testutil.Eventually(t, 5*time.Second, "the server to count the three idle clients", func() bool { return srv.clients.Load() == 3 })
	line, closed := rawReply(t, addr, "PING\r\n")
	must.Eq(t, "-ERR max number of clients reached\r\n", line)
	must.True(t, closed)
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.ReadAll(c)
		must.NoError(t, err) // EOF: the server closed it
	}
	line, _ = rawReply(t, addr, "PING\r\nQUIT\r\n")
	must.Eq(t, "+PONG\r\n", line)

	// The timeout is on by default (CONFIG GET timeout reports it, as Redis's).
	def := redis.NewClient(&redis.Options{Addr: startConfig(t, Config{})})
	defer def.Close()
	must.Eq(t, map[string]string{"timeout": "300"}, def.ConfigGet(context.Background(), "timeout").Val())

	// A negative IdleTimeout disables it.
	addr = startConfig(t, Config{IdleTimeout: -1})
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	time.Sleep(400 * time.Millisecond) // the input: idle past the 300 ms timeout above, with none set
	fmt.Fprintf(c, "PING\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err = bufio.NewReader(c).ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, "+PONG\r\n", line)
}
