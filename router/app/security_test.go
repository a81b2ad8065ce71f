package app

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// Issue #33 (second security audit): the router's own listeners as
// engines (item 1) and connection slots (item 6), on the real listener.

// Item 1 (a): engine registrations naming the router's own listener (as
// 127.0.0.1, localhost or 0.0.0.0) are left out of the pool, counted once
// each; the real engine serves every request.
func TestSelfRegistrationRefused(t *testing.T) {
	eng := newEngine(t, 1, 0)
	self := testutil.FreeAddr(t)
	_, port, _ := net.SplitHostPort(self)
	cfg := baseConfig(t, eng.URL)
	cfg.Listen = self
	for _, a := range []string{self, "localhost:" + port, "0.0.0.0:" + port} {
		cfg.Engines = append(cfg.Engines, StaticEngine{Model: "m", Address: a})
	}
	r := start(t, cfg)
	testutil.EventuallyEvery(t, 10*time.Second, 5*time.Millisecond, "the pool's first sync", r.pool.Synced)
	ws := r.pool.Workers("m")
	must.SliceLen(t, 1, ws)
	must.Eq(t, eng.Listener.Addr().String(), ws[0].Address)
	must.Eq(t, 3.0, promtest.ToFloat64(r.m.Loops.WithLabelValues("self_address")))
	for range 4 {
		resp := complete(t, http.DefaultClient, r.url("http"), false)
		io.Copy(io.Discard, resp.Body)
		must.Eq(t, http.StatusOK, resp.StatusCode)
	}
}

// Item 1 (a): which addresses are the router's own, for a listener on one
// address and one on every IPv4 address.
func TestIsSelf(t *testing.T) {
	lo, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer lo.Close()
	any4, err := net.Listen("tcp", "0.0.0.0:0")
	must.NoError(t, err)
	defer any4.Close()
	loPort := strconv.Itoa(lo.Addr().(*net.TCPAddr).Port)
	anyPort := strconv.Itoa(any4.Addr().(*net.TCPAddr).Port)
	a := &App{ln: lo, meshLn: any4, cfg: Config{Advertise: "router.example:7000"}}
	cases := map[string]bool{
		"127.0.0.1:" + loPort:      true,
		"localhost:" + loPort:      true,
		"0.0.0.0:" + loPort:        true,
		"127.0.0.2:" + loPort:      false, // loopback, but not the address bound
		"127.0.0.1:" + anyPort:     true,
		"127.0.0.9:" + anyPort:     true,
		"[::1]:" + anyPort:         true,  // Go listens on 0.0.0.0 dual stack
		"192.0.2.1:" + anyPort:     false, // not this host's
		"127.0.0.1:1":              false,
		"router.example:7000":      true, // -advertise
		"ROUTER.example:7000":      true,
		"router.example:7001":      false,
		"engine.example:" + loPort: false, // names are not resolved
		"garbage":                  false,
	}
	if ip := firstLocalIPv4(t); ip.IsValid() {
		cases[netip.AddrPortFrom(ip, uint16(any4.Addr().(*net.TCPAddr).Port)).String()] = true
		cases[netip.AddrPortFrom(ip, uint16(lo.Addr().(*net.TCPAddr).Port)).String()] = false
	}
	for addr, want := range cases {
		must.Eq(t, want, a.isSelf(addr), must.Sprint(addr))
	}
}

// firstLocalIPv4 is an IPv4 address of a non-loopback interface, if any.
func firstLocalIPv4(t *testing.T) netip.Addr {
	addrs, err := net.InterfaceAddrs()
	must.NoError(t, err)
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap().Is4() && !ip.IsLoopback() {
				return ip.Unmap()
			}
		}
	}
	return netip.Addr{}
}

// getHealth sends GET /health on c and reads the answer (deadline: a bound
// for a failing test, not a wait).
func getHealth(c net.Conn, br *bufio.Reader) error {
	c.SetDeadline(time.Now().Add(10 * time.Second))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// startBody sends the head of a completion whose body never comes: the
// connection stays active (the gateway waits for the body).
func startBody(t *testing.T, c net.Conn) {
	_, err := io.WriteString(c, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
	must.NoError(t, err)
}

// counts are the limiter's open and idle connections.
func (l *connLimiter) counts() (open, idle int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.idle.Len()
}

func (l *connLimiter) setPressureIdle(d time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pressureIdle = d
}

func waitCounts(t *testing.T, l *connLimiter, open, idle int) {
	t.Helper()
	testutil.EventuallyEvery(t, 10*time.Second, 2*time.Millisecond, fmt.Sprintf("%d open and %d idle connections", open, idle), func() bool {
		o, i := l.counts()
		return o == open && i == idle
	})
}

// Item 6: keep-alive connections that sent one GET /health and stayed
// idle do not hold the cap: at the cap a new client is served and the
// connection idle longest is closed.
func TestIdleConnectionsMakeRoom(t *testing.T) {
	eng := newEngine(t, 1, 0)
	cfg := baseConfig(t, eng.URL)
	cfg.MaxConnections = 4
	r := start(t, cfg)
	lim := r.ln.(*connLimiter)
	lim.setPressureIdle(time.Hour) // only the cap closes idle connections here, however slow the test

	var conns []net.Conn
	var readers []*bufio.Reader
	for i := range 4 {
		c, err := net.Dial("tcp", r.Addr().String())
		must.NoError(t, err)
		defer c.Close()
		br := bufio.NewReader(c)
		must.NoError(t, getHealth(c, br))
		conns, readers = append(conns, c), append(readers, br)
		waitCounts(t, lim, i+1, i+1)
	}
	c, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer c.Close()
	must.NoError(t, getHealth(c, bufio.NewReader(c)), must.Sprint("a new client at the cap of idle connections"))
	must.Eq(t, 1.0, promtest.ToFloat64(r.m.IdleConnsClosed.WithLabelValues("cap")))

	// The oldest was closed; the others still serve.
	conns[0].SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = readers[0].ReadByte()
	must.ErrorIs(t, err, io.EOF)
	must.NoError(t, getHealth(conns[3], readers[3]))
}

// Item 6: near the cap (3/4), connections idle past the short idle
// timeout (here: any) are closed as new ones arrive, below the cap too.
func TestIdleConnectionsClosedUnderPressure(t *testing.T) {
	eng := newEngine(t, 1, 0)
	cfg := baseConfig(t, eng.URL)
	cfg.MaxConnections = 4
	r := start(t, cfg)
	lim := r.ln.(*connLimiter)
	lim.setPressureIdle(0)

	for i := range 3 {
		c, err := net.Dial("tcp", r.Addr().String())
		must.NoError(t, err)
		defer c.Close()
		must.NoError(t, getHealth(c, bufio.NewReader(c)))
		waitCounts(t, lim, i+1, i+1)
	}
	c, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer c.Close()
	must.NoError(t, getHealth(c, bufio.NewReader(c)))
	must.Eq(t, 1.0, promtest.ToFloat64(r.m.IdleConnsClosed.WithLabelValues("pressure")))
	must.Eq(t, 0.0, promtest.ToFloat64(r.m.IdleConnsClosed.WithLabelValues("cap")))
	waitCounts(t, lim, 3, 3)
}

// Item 6: with the cap reached by active connections, a new one waits
// until one of them closes (none is idle to make room).
func TestMaxConnections(t *testing.T) {
	eng := newEngine(t, 1, 0)
	cfg := baseConfig(t, eng.URL)
	cfg.MaxConnections = 2
	r := start(t, cfg)
	lim := r.ln.(*connLimiter)

	var conns []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", r.Addr().String())
		must.NoError(t, err)
		defer c.Close()
		startBody(t, c)
		conns = append(conns, c)
	}
	waitCounts(t, lim, 2, 0)
	third, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer third.Close()
	_, err = io.WriteString(third, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	must.NoError(t, err)
	third.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	br := bufio.NewReader(third)
	_, err = br.Peek(1)
	var ne net.Error
	must.True(t, errors.As(err, &ne) && ne.Timeout(), must.Sprintf("third connection served: %v", err))

	conns[0].Close()
	third.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(br, nil)
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
}

// Item 6: one source holds at most -max-connections-per-source
// connections: past it its idle connection makes room, else the new one
// is closed; another source is not affected.
func TestConnectionsPerSource(t *testing.T) {
	eng := newEngine(t, 1, 0)
	cfg := baseConfig(t, eng.URL)
	cfg.MaxConnections = 100
	cfg.MaxConnectionsPerSource = 2
	r := start(t, cfg)
	lim := r.ln.(*connLimiter)

	active, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer active.Close()
	startBody(t, active)
	idle, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer idle.Close()
	must.NoError(t, getHealth(idle, bufio.NewReader(idle)))
	waitCounts(t, lim, 2, 1)

	// A third from 127.0.0.1 closes the idle one and is served.
	c, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer c.Close()
	must.NoError(t, getHealth(c, bufio.NewReader(c)))
	must.Eq(t, 1.0, promtest.ToFloat64(r.m.IdleConnsClosed.WithLabelValues("per_source")))
	waitCounts(t, lim, 2, 1)

	// Make both active: a fourth is refused.
	startBody(t, c)
	waitCounts(t, lim, 2, 0)
	refused, err := net.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer refused.Close()
	refused.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = refused.Read(make([]byte, 1))
	must.Error(t, err)
	var ne net.Error
	must.False(t, errors.As(err, &ne) && ne.Timeout(), must.Sprintf("not closed: %v", err))
	must.Eq(t, 1.0, promtest.ToFloat64(r.m.ConnsRefused.WithLabelValues("per_source")))

	// Another source is served.
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}}
	other, err := d.Dial("tcp", r.Addr().String())
	must.NoError(t, err)
	defer other.Close()
	must.NoError(t, getHealth(other, bufio.NewReader(other)))
}
