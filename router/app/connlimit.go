package app

import (
	"container/list"
	"crypto/tls"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/metrics"
)

// Client connections (issue #33). net/http keeps an idle keep-alive
// connection for the server's IdleTimeout (120 s): with a plain cap on
// connections, 4,096 clients that each sent one GET /health and stayed held
// every slot, and everyone else waited in the kernel's accept queue for two
// minutes. connLimiter caps connections without letting idle ones hold the
// cap:
//
//   - At the cap, a new connection closes the connection idle longest
//     (counted as cap); only when none is idle does it wait, as before, for
//     one to close or turn idle.
//   - Near the cap (three quarters of it), connections idle longer than
//     pressureIdle are closed as new ones arrive (pressure): a short idle
//     timeout while slots are scarce, the server's 120 s otherwise.
//   - A source (an IPv4 address, an IPv6 /64) holds at most perSource
//     connections: past it, its own idle connection is closed (per_source),
//     else the new connection is closed at once (refused).
//
// Idle is net/http's StateIdle (between requests; an HTTP/2 connection
// without streams), followed through the server's ConnState hook. A
// connection that has not sent its first request yet is not idle: the
// server's ReadHeaderTimeout bounds it. Closing an idle connection races
// with a request its client may be sending on it, as any keep-alive
// timeout does; the longest idle goes first.
type connLimiter struct {
	net.Listener
	max, perSource int
	pressureIdle   time.Duration
	m              *metrics.Metrics

	mu       sync.Mutex
	open     int
	bySource map[netip.Addr]int
	idle     list.List     // *limitedConn, idle longest first
	changed  chan struct{} // closed (and replaced) when a connection closes or turns idle while waiting
	waiting  bool          // Accept waits on changed
	closed   bool
}

// pressureIdleTimeout is the idle timeout near the cap.
const pressureIdleTimeout = 5 * time.Second

func newConnLimiter(ln net.Listener, max, perSource int, m *metrics.Metrics) *connLimiter {
	return &connLimiter{Listener: ln, max: max, perSource: perSource, pressureIdle: pressureIdleTimeout, m: m,
		bySource: map[netip.Addr]int{}, changed: make(chan struct{})}
}

// limitedConn is a connection the limiter counts.
type limitedConn struct {
	net.Conn
	l      *connLimiter
	source netip.Addr // zero: not a TCP peer, no per-source count
	elem   *list.Element
	since  time.Time // when it turned idle
	gone   bool      // no longer counted (closed, or closed by the limiter)
}

// Accept returns the next connection the limits let in.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		lc, err := l.admit(c)
		if err != nil {
			c.Close()
			return nil, err
		}
		if lc != nil {
			return lc, nil
		}
		c.Close() // refused: the source is at its limit
	}
}

// admit counts c in, closing idle connections to make room or waiting for
// one; nil when c's source is at its limit with nothing idle.
func (l *connLimiter) admit(c net.Conn) (*limitedConn, error) {
	lc := &limitedConn{Conn: c, l: l, source: sourceOf(c.RemoteAddr())}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.perSource > 0 && lc.source.IsValid() && l.bySource[lc.source] >= l.perSource {
		old := l.oldestIdle(lc.source)
		if old == nil {
			l.m.ConnsRefused.WithLabelValues("per_source").Inc()
			return nil, nil
		}
		l.evict(old, "per_source")
	}
	if l.max > 0 {
		l.relieve(time.Now())
		for l.open >= l.max {
			if old := l.oldestIdle(netip.Addr{}); old != nil {
				l.evict(old, "cap")
				continue
			}
			if l.closed {
				return nil, net.ErrClosed
			}
			ch := l.changed
			l.waiting = true
			l.mu.Unlock()
			<-ch
			l.mu.Lock()
		}
	}
	l.open++
	if lc.source.IsValid() {
		l.bySource[lc.source]++
	}
	l.m.ClientConnections.Set(float64(l.open))
	return lc, nil
}

// relieve closes, near the cap, the connections idle past pressureIdle.
func (l *connLimiter) relieve(now time.Time) {
	for l.open*4 >= l.max*3 {
		e := l.idle.Front()
		if e == nil {
			return
		}
		old := e.Value.(*limitedConn)
		if now.Sub(old.since) < l.pressureIdle {
			return
		}
		l.evict(old, "pressure")
	}
}

// oldestIdle is the connection idle longest (from source, when valid).
func (l *connLimiter) oldestIdle(source netip.Addr) *limitedConn {
	for e := l.idle.Front(); e != nil; e = e.Next() {
		if lc := e.Value.(*limitedConn); !source.IsValid() || lc.source == source {
			return lc
		}
	}
	return nil
}

// evict closes an idle connection and stops counting it. The server's
// goroutine on it ends on the read error.
func (l *connLimiter) evict(lc *limitedConn, reason string) {
	l.release(lc)
	l.m.IdleConnsClosed.WithLabelValues(reason).Inc()
	_ = lc.Conn.Close()
}

// release stops counting lc (idempotent); l.mu held.
func (l *connLimiter) release(lc *limitedConn) {
	if lc.gone {
		return
	}
	lc.gone = true
	if lc.elem != nil {
		l.idle.Remove(lc.elem)
		lc.elem = nil
	}
	l.open--
	if lc.source.IsValid() {
		if n := l.bySource[lc.source] - 1; n > 0 {
			l.bySource[lc.source] = n
		} else {
			delete(l.bySource, lc.source)
		}
	}
	l.m.ClientConnections.Set(float64(l.open))
	l.signal()
}

// signal wakes an Accept waiting for room; l.mu held.
func (l *connLimiter) signal() {
	if !l.waiting {
		return
	}
	l.waiting = false
	close(l.changed)
	l.changed = make(chan struct{})
}

// Close closes the listener and wakes an Accept waiting for room.
func (l *connLimiter) Close() error {
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		l.waiting = true // wake it whether or not it waits: it checks closed
		l.signal()
	}
	l.mu.Unlock()
	return l.Listener.Close()
}

// connState is the server's ConnState hook: it follows which connections
// are idle.
func (l *connLimiter) connState(c net.Conn, s http.ConnState) {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn()
	}
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.gone {
		return
	}
	switch s {
	case http.StateIdle:
		if lc.elem != nil {
			l.idle.Remove(lc.elem)
		}
		lc.since = time.Now()
		lc.elem = l.idle.PushBack(lc)
		l.signal()
	case http.StateActive, http.StateHijacked:
		if lc.elem != nil {
			l.idle.Remove(lc.elem)
			lc.elem = nil
		}
	case http.StateClosed:
		l.release(lc)
	}
}

// Close closes the connection and stops counting it.
func (lc *limitedConn) Close() error {
	lc.l.mu.Lock()
	lc.l.release(lc)
	lc.l.mu.Unlock()
	return lc.Conn.Close()
}

// sourceOf is the per-source key of a peer: its IPv4 address, or its IPv6
// /64 (one host's share of addresses); zero for other peers.
func sourceOf(a net.Addr) netip.Addr {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Addr{}
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Addr{}
	}
	ip = ip.Unmap().WithZone("")
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.Addr()
	}
	return ip
}
