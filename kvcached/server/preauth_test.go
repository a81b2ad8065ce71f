package server

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/kvcached/store"
)

// serveReg is serve that also returns the server's registry.
func serveReg(t *testing.T, cfg Config) (string, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	st, err := store.Open(store.Config{RAMBytes: 64 << 20, MaxValue: 4 << 20, Metrics: store.NewMetrics(reg)})
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
	return l.Addr().String(), reg
}

// gathered returns the value of a metric (name{label="value"}), or -1 when
// the registry has no such series.
func gathered(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if label != "" && !hasLabel(m, label, value) {
				continue
			}
			switch {
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Counter != nil:
				return m.Counter.GetValue()
			}
		}
	}
	return -1
}

func hasLabel(m *dto.Metric, name, value string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}

// partialCommand is what each attacking connection sends: a 10-argument
// command (the most a client may send before AUTH) of 16 KiB arguments
// (the largest it may send), nine of them whole and the last one cut short,
// so the server holds the command while it waits for the rest.
func partialCommand() []byte {
	var b bytes.Buffer
	arg := strings.Repeat("x", 16384)
	b.WriteString("*10\r\n")
	for i := 0; i < 9; i++ {
		fmt.Fprintf(&b, "$16384\r\n%s\r\n", arg)
	}
	fmt.Fprintf(&b, "$16384\r\n%s", arg[:1000])
	return b.Bytes()
}

// Many connections holding partial unauthenticated commands are bounded by
// the unauthenticated allowance, take nothing from the in-flight budget, and
// an authenticated client is still served at once, large values included.
// Before the allowance each one took the in-flight budget for its arguments
// (and a 64 KiB read buffer): 200 of them spent a 2 MiB budget and the
// authenticated client's SET waited for the auth timeout.
func TestUnauthenticatedConnectionsAreBoundedAndDoNotStarveClients(t *testing.T) {
	const allowance = 1 << 20
	addr, reg := serveReg(t, Config{Password: "s3cret", InflightBytes: 2 << 20, UnauthenticatedBytes: allowance, AuthTimeout: time.Minute})
	cmd := partialCommand()
	const conns = 200
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	var peak float64
	var mu sync.Mutex
	for i := 0; i < conns; i++ {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Errorf("dial: %v", err)
				return
			}
			t.Cleanup(func() { c.Close() })
			c.SetWriteDeadline(time.Now().Add(2 * time.Second))
			c.Write(cmd) // fails once the server closed it: counted below
			mu.Lock()
			peak = max(peak, gathered(t, reg, "oasis_kvcached_unauthenticated_bytes", "", ""))
			mu.Unlock()
		}()
	}
	wg.Wait()
	// An authenticated client is served at once, large values included:
	// the in-flight budget is all its own.
	ctx := context.Background()
	good := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret", ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxRetries: -1})
	defer good.Close()
	big := bytes.Repeat([]byte{9}, 1<<20)
	must.NoError(t, good.Set(ctx, "big", big, 0).Err())
	got, err := good.Get(ctx, "big").Bytes()
	must.NoError(t, err)
	must.True(t, bytes.Equal(big, got))
	// Every connection is either still held (charged) or was closed by the
	// server: as the oldest when newer ones came, or when its arguments did
	// not fit.
	held := func() float64 { return gathered(t, reg, "oasis_kvcached_unauthenticated_connections", "", "") }
	closed := func(reason string) float64 {
		return max(0, gathered(t, reg, "oasis_kvcached_connections_closed_total", "reason", reason))
	}
	testutil.Eventually(t, 10*time.Second, "every unauthenticated connection to be held or closed", func() bool {
		return held()+closed(closedUnauthEvicted)+closed(closedUnauthMemory) >= conns
	})
	used := gathered(t, reg, "oasis_kvcached_unauthenticated_bytes", "", "")
	t.Logf("unauthenticated: %v bytes in %v connections (peak sampled %v); closed: %v evicted, %v over the allowance",
		used, held(), peak, closed(closedUnauthEvicted), closed(closedUnauthMemory))
	must.LessEq(t, float64(allowance), used)
	must.LessEq(t, float64(allowance), peak)
	must.Greater(t, 0, closed(closedUnauthEvicted)+closed(closedUnauthMemory))
	must.LessEq(t, float64(allowance/preAuthConnBytes), held())
}

// An unauthenticated argument that does not fit in the allowance closes its
// connection with a clear error; a new connection pushes the oldest
// unauthenticated one out rather than being refused.
func TestUnauthenticatedAllowanceRefusesAndEvicts(t *testing.T) {
	// Room for four connections' base (the least the server allows), or one
	// with four 16 KiB arguments, not five.
	addr, reg := serveReg(t, Config{Password: "s3cret", UnauthenticatedBytes: 4*preAuthConnBytes + 8<<10, AuthTimeout: time.Minute})
	a, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer a.Close()
	a.SetDeadline(time.Now().Add(5 * time.Second))
	ar := bufio.NewReader(a)
	arg := strings.Repeat("y", 16384)
	fmt.Fprintf(a, "*6\r\n$4\r\nECHO\r\n%s", strings.Repeat("$16384\r\n"+arg+"\r\n", 5))
	line, err := ar.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, "-ERR Protocol error: unauthenticated connections' memory limit reached\r\n", line)
	_, err = ar.ReadByte()
	must.Error(t, err) // closed
	must.Eq(t, 1.0, gathered(t, reg, "oasis_kvcached_connections_closed_total", "reason", closedUnauthMemory))
	testutil.EventuallyEvery(t, 5*time.Second, 5*time.Millisecond, "the unauthenticated bytes gauge to return to 0", func() bool {
		return gathered(t, reg, "oasis_kvcached_unauthenticated_bytes", "", "") == 0
	})

	// Four idle unauthenticated connections fill the allowance; a fifth
	// closes the oldest and is served.
	var idle []net.Conn
	for i := 0; i < 4; i++ {
		c, err := net.Dial("tcp", addr)
		must.NoError(t, err)
		defer c.Close()
		idle = append(idle, c)
		fmt.Fprintf(c, "PING\r\n")
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		must.NoError(t, err)
		must.Eq(t, "-NOAUTH Authentication required.\r\n", line)
	}
	must.Eq(t, 0.0, max(0, gathered(t, reg, "oasis_kvcached_connections_closed_total", "reason", closedUnauthEvicted)))
	line, _ = rawReply(t, addr, "AUTH s3cret\r\nPING\r\nQUIT\r\n")
	must.Eq(t, "+OK\r\n", line)
	idle[0].SetReadDeadline(time.Now().Add(5 * time.Second))
	_, err = io.ReadAll(idle[0])
	must.NoError(t, err) // EOF: closed by the server
	must.Eq(t, 1.0, gathered(t, reg, "oasis_kvcached_connections_closed_total", "reason", closedUnauthEvicted))
	// The newer ones are still served.
	for _, c := range idle[1:] {
		fmt.Fprintf(c, "AUTH s3cret\r\n")
		line, err = bufio.NewReader(c).ReadString('\n')
		must.NoError(t, err)
		must.Eq(t, "+OK\r\n", line)
	}
}

// A connection gets MaxAuthFailures wrong passwords, each answered after
// AuthFailureDelay, and is then closed; the right password still works on
// a new connection. Before the cap a connection could guess without limit.
func TestFailedAuthAttemptsAreCappedPerConnection(t *testing.T) {
	addr, reg := serveReg(t, Config{Password: "s3cret", AuthFailureDelay: 50 * time.Millisecond})
	c, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	// Pipelined: the guesses after the third are never answered.
	begin := time.Now()
	fmt.Fprintf(c, "AUTH guess1\r\nHELLO 3 AUTH default guess2\r\nAUTH default guess3\r\nAUTH s3cret\r\nPING\r\n")
	r := bufio.NewReader(c)
	for i := 0; i < DefaultMaxAuthFailures; i++ {
		line, err := r.ReadString('\n')
		must.NoError(t, err)
		must.Eq(t, "-WRONGPASS invalid username-password pair or user is disabled.\r\n", line)
	}
	rest, err := io.ReadAll(r)
	must.NoError(t, err) // EOF: closed after the third failure
	must.Eq(t, "", string(rest))
	must.Greater(t, 3*50*time.Millisecond, time.Since(begin))
	must.Eq(t, 3.0, gathered(t, reg, "oasis_kvcached_auth_failures_total", "", ""))
	must.Eq(t, 1.0, gathered(t, reg, "oasis_kvcached_connections_closed_total", "reason", closedAuthFailures))

	// Fewer failures than the cap keep the connection, and AUTH then works.
	c1, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c1.Close()
	c1.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c1, "AUTH wrong\r\nAUTH wrong\r\nAUTH s3cret\r\nPING\r\n")
	r1 := bufio.NewReader(c1)
	for _, want := range []string{"-WRONGPASS", "-WRONGPASS", "+OK", "+PONG"} {
		line, err := r1.ReadString('\n')
		must.NoError(t, err)
		must.StrHasPrefix(t, want, line)
	}
	good := redis.NewClient(&redis.Options{Addr: addr, Password: "s3cret"})
	defer good.Close()
	must.NoError(t, good.Ping(context.Background()).Err())

	// A negative cap leaves guesses unlimited, as Redis does.
	addr, _ = serveReg(t, Config{Password: "s3cret", MaxAuthFailures: -1, AuthFailureDelay: -1})
	c2, err := net.Dial("tcp", addr)
	must.NoError(t, err)
	defer c2.Close()
	c2.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(c2, "%sAUTH s3cret\r\n", strings.Repeat("AUTH nope\r\n", 10))
	r2 := bufio.NewReader(c2)
	for i := 0; i < 10; i++ {
		line, err := r2.ReadString('\n')
		must.NoError(t, err)
		must.StrHasPrefix(t, "-WRONGPASS", line)
	}
	line, err := r2.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, "+OK\r\n", line)
}
