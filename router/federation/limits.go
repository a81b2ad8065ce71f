package federation

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
	"golang.org/x/time/rate"
)

// peerConns counts the listener's connections per remote address.
type peerConns struct {
	mu  sync.Mutex
	n   map[string]int
	max int
}

func (p *peerConns) acquire(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[key] >= p.max {
		return false
	}
	if p.n == nil {
		p.n = map[string]int{}
	}
	p.n[key]++
	return true
}

func (p *peerConns) release(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.n[key]--; p.n[key] <= 0 {
		delete(p.n, key)
	}
}

// peerKey is the address a connection is counted under.
func peerKey(a net.Addr) string {
	switch a := a.(type) {
	case *net.UDPAddr:
		return a.IP.String()
	case *net.TCPAddr:
		return a.IP.String()
	}
	host, _, err := net.SplitHostPort(a.String())
	if err != nil {
		return a.String()
	}
	return host
}

// quicTooManyConns is the application error a connection over the per-peer
// bound is closed with.
const quicTooManyConns quic.ApplicationErrorCode = 0x1000

// limitedQUIC accepts at most MaxConnsPerPeer connections per remote
// address at once; the rest are closed as they arrive.
type limitedQUIC struct {
	*quic.EarlyListener
	f *Federation
}

func (l limitedQUIC) Accept(ctx context.Context) (*quic.Conn, error) {
	for {
		c, err := l.EarlyListener.Accept(ctx)
		if err != nil {
			return nil, err
		}
		key := peerKey(c.RemoteAddr())
		if !l.f.conns.acquire(key) {
			l.f.m.connsRefused.Inc()
			_ = c.CloseWithError(quicTooManyConns, "federation: too many connections from this address")
			continue
		}
		go func() { <-c.Context().Done(); l.f.conns.release(key) }()
		return c, nil
	}
}

// LimitListener bounds a TLS (HTTP/2) listener serving Handler as the
// HTTP/3 listener is: at most MaxConnsPerPeer connections per remote
// address at once, the rest closed as they are accepted.
func (f *Federation) LimitListener(ln net.Listener) net.Listener {
	return limitedTCP{Listener: ln, f: f}
}

type limitedTCP struct {
	net.Listener
	f *Federation
}

func (l limitedTCP) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key := peerKey(c.RemoteAddr())
		if !l.f.conns.acquire(key) {
			l.f.m.connsRefused.Inc()
			_ = c.Close()
			continue
		}
		return &countedConn{Conn: c, release: func() { l.f.conns.release(key) }}, nil
	}
}

type countedConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

// forwardLimits bound each datacenter's forwarded requests: a rate and a
// number in flight. Callers are authenticated datacenters Consul lists, so
// the map is bounded by the real datacenters.
type forwardLimits struct {
	mu       sync.Mutex
	rate     rate.Limit
	burst    int
	inFlight int
	dcs      map[string]*dcLimit
}

type dcLimit struct {
	lim      *rate.Limiter
	inFlight int
}

func (l *forwardLimits) init(c Config) {
	l.rate, l.burst, l.inFlight = rate.Limit(c.ForwardedRate), c.ForwardedBurst, c.MaxForwardedInFlight
	l.dcs = map[string]*dcLimit{}
}

// acquire takes a slot for a request from dc, or says why not ("rate",
// "in_flight").
func (l *forwardLimits) acquire(dc string, now time.Time) (release func(), reason string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	d := l.dcs[dc]
	if d == nil {
		if len(l.dcs) >= maxRemoteDCs {
			clear(l.dcs) // only listed datacenters get here: start over rather than grow
		}
		d = &dcLimit{lim: rate.NewLimiter(l.rate, l.burst)}
		l.dcs[dc] = d
	}
	if d.inFlight >= l.inFlight {
		return nil, "in_flight"
	}
	if !d.lim.AllowN(now, 1) {
		return nil, "rate"
	}
	d.inFlight++
	return func() {
		l.mu.Lock()
		d.inFlight--
		l.mu.Unlock()
	}, ""
}

// probeTimed bounds the half-open breaker's probe: a request to a
// datacenter whose breaker is half-open is the one Begin let through, and
// it gets ProbeTimeout for its response head instead of the request's own
// response timeout, so a stalling peer costs that probe little.
type probeTimed struct {
	rt http.RoundTripper
	f  *Federation
}

// ErrProbeTimeout is a half-open probe that got no response head within
// Config.ProbeTimeout.
var ErrProbeTimeout = errors.New("federation: the half-open probe got no response head within the probe timeout")

func (p probeTimed) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Path == SummaryPath || !p.f.halfOpen(p.f.peerDC(req.URL.Host)) {
		return p.rt.RoundTrip(req)
	}
	ctx, cancel := context.WithCancelCause(req.Context())
	t := time.AfterFunc(p.f.cfg.ProbeTimeout, func() { cancel(ErrProbeTimeout) })
	resp, err := p.rt.RoundTrip(req.WithContext(ctx))
	if !t.Stop() {
		if err == nil {
			_ = resp.Body.Close()
		}
		cancel(nil)
		return nil, fmt.Errorf("%w (%s, to %s)", ErrProbeTimeout, p.f.cfg.ProbeTimeout, req.URL.Host)
	}
	if err != nil {
		cancel(nil)
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

type cancelBody struct {
	io.ReadCloser
	cancel context.CancelCauseFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}

// halfOpen reports whether dc's breaker is half-open (its probe is out).
func (f *Federation) halfOpen(dc string) bool {
	if dc == "" {
		return false
	}
	f.mu.Lock()
	rd := f.remote[dc]
	f.mu.Unlock()
	if rd == nil {
		return false
	}
	rd.breaker.mu.Lock()
	defer rd.breaker.mu.Unlock()
	return rd.breaker.state == HalfOpen
}

type closerFunc func() error

func (c closerFunc) Close() error { return c() }

// expire drops each router's summary older than RemoteTTL (twice
// summary_stale if longer), and the entries of
// datacenters with none whose routers Consul no longer lists, so a
// datacenter that went away frees its place in the table.
func (f *Federation) expire(now time.Time) {
	known := map[string]bool{}
	for _, p := range f.allPeers() {
		known[p.DC] = true
	}
	ttl := max(f.cfg.RemoteTTL, 2*f.cfg.Policy().SummaryStale)
	f.mu.Lock()
	defer f.mu.Unlock()
	for dc, rd := range f.remote {
		rd.dropStale(now, ttl)
		if !rd.received.IsZero() && len(rd.routers) == 0 {
			rd.received = time.Time{}
			f.m.summaryAge.DeleteLabelValues(dc)
			f.m.expired.Inc()
		}
		if rd.received.IsZero() && !known[dc] {
			delete(f.remote, dc)
			f.m.breaker.DeleteLabelValues(dc)
			f.m.routers.DeleteLabelValues(dc)
			f.m.remoteInFlight.DeleteLabelValues(dc)
		}
	}
}
