// Package federation lets routers in different datacenters send each other
// requests: route a request to where the cache and capacity are, and never
// move KV cache across the WAN. Each router finds the others through Consul
// (service Service in every WAN-federated datacenter), pushes them a
// per-model Summary every second over HTTP/3 with mutual TLS, and asks
// Decide, per request, whether another datacenter would serve it sooner.
// A forwarded request crosses at most one datacenter boundary: a router
// serves what arrives on its federation listener locally, always.
package federation

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/http3"

	"github.com/oasis-llm/oasis/internal/bloom"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Headers of a forwarded request.
const (
	// FromHeader names the datacenter a request was forwarded from. It is
	// informational: what makes a request forwarded is the listener it
	// arrived on, whose clients are authenticated peers.
	FromHeader = "X-Oasis-Federated-From"
	// SummaryPath receives summaries on the federation listener.
	SummaryPath = "/federation/v1/summary"
)

// Config configures a Federation.
type Config struct {
	DC string // this datacenter (required)
	// Name is this router among its datacenter's routers, sent with each
	// summary (RouterHeader) so that a peer keeps one summary per router
	// and sums them: up to 128 printable bytes without spaces; empty (as
	// the router leaves it): a random name made by New, one per process.
	Name     string
	Consul   *consulapi.Client                // finds peers; nil: only StaticPeers
	Identity Identity                         // mutual TLS (required)
	Listen   string                           // UDP address of the HTTP/3 listener; "" serves none
	Handler  http.Handler                     // serves forwarded requests (required with Listen)
	Policy   func() policy.FederationSettings // the current settings (required)
	// Local returns this datacenter's current figures per model, without
	// Prefixes (the federation adds the hot-prefix filters). Required.
	Local func() []ModelSummary

	// Transport, when set, replaces the HTTP/3 client (its peers then serve
	// Handler on a listener of the same protocol). Peers' datacenters are
	// then checked on answers, not at the handshake: prefer HTTP2.
	Transport http.RoundTripper
	// HTTP2 makes the client HTTP/2 over TLS (TCP) instead of HTTP/3, with
	// the same per-dial checks: benchmarks compare the two, its peers serve
	// Handler on a TLS listener (LimitListener bounds it per peer).
	HTTP2 bool

	StaticPeers  []Peer        // peers besides Consul's (tests, fixed topologies)
	Interval     time.Duration // between two summary pushes; default 1s
	PushTimeout  time.Duration // one push; default 1s
	QueryWait    time.Duration // a blocking Consul query's wait; default 5s
	QueryTimeout time.Duration // added to QueryWait for a cross-DC query's deadline; default 2s
	HotKeys      int           // prefix block keys remembered per model; default 1024

	// Limits on what peers may do. A peer is a remote address (connections)
	// or the datacenter its certificate names (requests).
	MaxConnsPerPeer int // connections at once from one address (QUIC or TLS); default 16
	// ForwardedRate and ForwardedBurst bound the requests each datacenter
	// forwards here, per second; default 1000 and 1000. Past them a request
	// is answered 429 and the forwarding router serves it itself.
	ForwardedRate  float64
	ForwardedBurst int
	// MaxForwardedInFlight bounds each datacenter's forwarded requests being
	// served here at once; default 1024.
	MaxForwardedInFlight int
	// ProbeTimeout bounds the half-open breaker's probe until its response
	// head: a stalling datacenter costs the probe that long, not the
	// request's response timeout; default 3s.
	ProbeTimeout time.Duration
	// RemoteTTL is how long another datacenter's summary is kept: older
	// ones are dropped, and so is the datacenter's entry once Consul no
	// longer lists its routers; default 1m.
	RemoteTTL time.Duration

	Logger     hclog.Logger          // nil: no logs
	Registerer prometheus.Registerer // nil: metrics not registered

	now func() time.Time
}

// Errors of New.
var (
	ErrNoDC       = errors.New("federation: Config.DC is required and must be a valid name")
	ErrNoIdentity = errors.New("federation: Config.Identity is required")
)

// Federation is one router's view of, and link to, the other datacenters.
type Federation struct {
	cfg   Config
	log   hclog.Logger
	m     *fedMetrics
	cl    io.Closer // the client this federation made; closed with it
	rt    http.RoundTripper
	peers *peerSet
	rr    atomic.Uint64 // spreads forwards over a datacenter's routers
	conns peerConns     // connections per remote address on the listener
	fwd   forwardLimits // forwarded requests per datacenter

	mu        sync.Mutex
	static    []Peer               // Config.StaticPeers, or SetStaticPeers'
	remote    map[string]*remoteDC // by datacenter
	hot       map[string]*HotKeys  // by model
	spill     SpillBudget
	closeOnce sync.Once
	closeErr  error // the first Close's
	ln        net.PacketConn
	qln       *quic.EarlyListener
	srv       *http3.Server
}

// remoteDC is what this router knows of another datacenter.
type remoteDC struct {
	// routers are its routers' last summaries, by RouterHeader (merge.go);
	// received is the newest one's arrival (zero: none kept).
	routers  map[string]*routerSummary
	received time.Time
	rtt      time.Duration
	breaker  breaker
	live     *scoring.Live // this router's requests in flight there
}

// New validates c and returns a federation; Run starts it.
func New(c Config) (*Federation, error) {
	switch {
	case !validName(c.DC):
		return nil, ErrNoDC
	case c.Identity.Server == nil || c.Identity.Client == nil || c.Identity.PeerDC == nil:
		return nil, ErrNoIdentity
	case c.Policy == nil || c.Local == nil:
		return nil, errors.New("federation: Config.Policy and Config.Local are required")
	case c.Listen != "" && c.Handler == nil:
		return nil, errors.New("federation: Config.Handler is required with Listen")
	}
	if err := checkRouterName(c.Name); err != nil {
		return nil, fmt.Errorf("federation: Config.Name: %w", err)
	}
	for _, p := range c.StaticPeers {
		if !validName(p.DC) || p.DC == c.DC {
			return nil, fmt.Errorf("federation: static peer %q: bad datacenter %q", p.Addr, p.DC)
		}
	}
	setDefaults(&c)
	f := &Federation{cfg: c, log: c.Logger.Named("federation"),
		peers:  &peerSet{peers: map[string][]Peer{}, stale: map[string]bool{}},
		remote: map[string]*remoteDC{}, hot: map[string]*HotKeys{}, static: c.StaticPeers}
	f.conns.max = c.MaxConnsPerPeer
	f.fwd.init(c)
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	f.m = m
	switch {
	case c.Transport != nil:
		// Not ours: the datacenter is checked on each answer.
		f.rt = dcChecked{rt: c.Transport, f: f}
	case c.HTTP2:
		h2 := f.newH2Client()
		f.rt, f.cl = h2, closerFunc(func() error { h2.CloseIdleConnections(); return nil })
	default:
		h3, err := f.newH3Client()
		if err != nil {
			return nil, err
		}
		f.rt, f.cl = h3, h3
	}
	f.rt = probeTimed{rt: f.rt, f: f}
	if c.Listen != "" {
		if err := f.listen(); err != nil {
			f.Close()
			return nil, err
		}
	}
	return f, nil
}

func setDefaults(c *Config) {
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{{&c.Interval, time.Second}, {&c.PushTimeout, time.Second}, {&c.QueryWait, 5 * time.Second},
		{&c.QueryTimeout, 2 * time.Second}, {&c.ProbeTimeout, 3 * time.Second}, {&c.RemoteTTL, time.Minute}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if c.HotKeys <= 0 {
		c.HotKeys = 1024
	}
	if c.MaxConnsPerPeer <= 0 {
		c.MaxConnsPerPeer = 16
	}
	if c.ForwardedRate <= 0 {
		c.ForwardedRate = 1000
	}
	if c.ForwardedBurst <= 0 {
		c.ForwardedBurst = 1000
	}
	if c.MaxForwardedInFlight <= 0 {
		c.MaxForwardedInFlight = 1024
	}
	if c.now == nil {
		c.now = time.Now
	}
	if c.Name == "" {
		c.Name = randomName()
	}
}

// listen binds the HTTP/3 listener (New does, so a bad address or identity
// fails at start-up and Addr is known before Run).
func (f *Federation) listen() error {
	tc, err := f.cfg.Identity.serverTLS()
	if err != nil {
		return err
	}
	ln, err := net.ListenPacket("udp", f.cfg.Listen)
	if err != nil {
		return fmt.Errorf("federation: listening on %s: %w", f.cfg.Listen, err)
	}
	qln, err := quic.ListenEarly(ln, tc, quicServerConfig())
	if err != nil {
		_ = ln.Close()
		return fmt.Errorf("federation: listening on %s: %w", f.cfg.Listen, err)
	}
	f.ln, f.qln = ln, qln
	f.srv = &http3.Server{TLSConfig: tc, QUICConfig: quicServerConfig(), Handler: f.serverHandler()}
	return nil
}

// SetStaticPeers replaces the peers known besides Consul's (two routers
// that must each know the other's bound address).
func (f *Federation) SetStaticPeers(ps []Peer) error {
	for _, p := range ps {
		if !validName(p.DC) || p.DC == f.cfg.DC {
			return fmt.Errorf("federation: static peer %q: bad datacenter %q", p.Addr, p.DC)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.static = slices.Clone(ps)
	return nil
}

// Addr is the federation listener's address (nil without Listen).
func (f *Federation) Addr() net.Addr {
	if f.ln == nil {
		return nil
	}
	return f.ln.LocalAddr()
}

// DC is this router's datacenter.
func (f *Federation) DC() string { return f.cfg.DC }

// Transport reaches other datacenters' routers (HTTP/3, mutual TLS).
func (f *Federation) Transport() http.RoundTripper { return f.rt }

// Run serves and pushes summaries until ctx ends, then closes the listener
// and the client's connections.
func (f *Federation) Run(ctx context.Context) {
	var wg sync.WaitGroup
	if f.srv != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f.srv.ServeListener(limitedQUIC{EarlyListener: f.qln, f: f}); err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
				f.log.Error("federation listener failed", "error", err)
			}
		}()
	}
	if f.cfg.Consul != nil {
		wg.Add(1)
		go func() { defer wg.Done(); f.watchPeers(ctx) }()
	}
	f.pushLoop(ctx)
	f.Close()
	wg.Wait()
}

// Close releases the listener and the client's connections; Run calls it
// as it returns. For a Federation that will not Run. It may be called more
// than once; the first call's error is every later one's.
func (f *Federation) Close() error {
	f.closeOnce.Do(func() {
		var errs []error
		if f.srv != nil {
			errs = append(errs, f.srv.Close())
		}
		if f.qln != nil {
			errs = append(errs, f.qln.Close())
		}
		if f.ln != nil {
			if err := f.ln.Close(); !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err) // srv.Close closes it too
			}
		}
		if f.cl != nil {
			errs = append(errs, f.cl.Close())
		}
		f.closeErr = errors.Join(errs...)
	})
	return f.closeErr
}

// Handler is what the federation listener serves, for serving it on
// another listener as well.
func (f *Federation) Handler() http.Handler { return f.serverHandler() }

// serverHandler serves the federation listener: summaries, and forwarded
// requests, which are marked so the gateway never forwards them again. Every
// request is authenticated first: the caller's certificate must name a
// datacenter whose routers Consul lists (or a static peer's), and in the
// mesh the intentions must allow it now.
func (f *Federation) serverHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+SummaryPath, f.receive)
	mux.Handle("/", http.HandlerFunc(f.serveForwarded))
	auth := f.cfg.Identity.Authorize
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil || auth != nil && auth(*r.TLS) != nil {
			f.m.refused.WithLabelValues("", "identity").Inc()
			http.Error(w, "federation: caller not authorized", http.StatusForbidden)
			return
		}
		dc, err := f.caller(*r.TLS)
		if err != nil {
			f.m.refused.WithLabelValues("", "identity").Inc()
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, dc)))
	})
}

// Errors of a caller's identity (403).
var (
	ErrNoPeerDC   = errors.New("federation: the caller's certificate names no datacenter (URI SAN spiffe://<trust domain>/ns/<ns>/dc/<dc>/svc/oasis-router)")
	ErrUnlistedDC = errors.New("federation: the datacenter the caller's certificate names has no router Consul lists")
	ErrSummaryDC  = errors.New("federation: the summary's datacenter is not the caller's")
	ErrOwnDC      = errors.New("federation: the caller's certificate names this router's own datacenter")
)

// caller is the datacenter a connection's peer speaks for.
func (f *Federation) caller(cs tls.ConnectionState) (string, error) {
	dc := f.cfg.Identity.PeerDC(cs)
	switch {
	case dc == "":
		return "", ErrNoPeerDC
	case dc == f.cfg.DC:
		return "", ErrOwnDC
	case !f.knownDC(dc):
		return "", fmt.Errorf("%w: %q", ErrUnlistedDC, dc)
	}
	return dc, nil
}

// knownDC reports whether dc has a router Consul lists (or a static peer).
func (f *Federation) knownDC(dc string) bool {
	for _, p := range f.allPeers() {
		if p.DC == dc {
			return true
		}
	}
	return false
}

type callerKey struct{}

// callerDC is the authenticated datacenter of a request on the listener.
func callerDC(ctx context.Context) string { v, _ := ctx.Value(callerKey{}).(string); return v }

// serveForwarded serves a request another datacenter's router forwarded,
// within that datacenter's rate and in-flight limits (429 past them: the
// forwarding router serves it itself).
func (f *Federation) serveForwarded(w http.ResponseWriter, r *http.Request) {
	dc := callerDC(r.Context())
	release, reason := f.fwd.acquire(dc, f.cfg.now())
	if reason != "" {
		f.m.refused.WithLabelValues(dc, reason).Inc()
		w.Header().Set("Retry-After", "1")
		http.Error(w, "federation: too many requests forwarded from "+dc+" ("+reason+")", http.StatusTooManyRequests)
		return
	}
	defer release()
	f.cfg.Handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true)))
}

// maxRemoteDCs bounds the datacenters a router keeps state for.
const maxRemoteDCs = 64

type forwardedKey struct{}

// Forwarded reports whether the request with ctx arrived from another
// datacenter's router: it must be served locally.
func Forwarded(ctx context.Context) bool { v, _ := ctx.Value(forwardedKey{}).(bool); return v }

// receive stores a peer's summary: only for the datacenter the caller's
// certificate names, with filters that are evidence of something, as the
// summary of the router RouterHeader names (merge.go sums them).
func (f *Federation) receive(w http.ResponseWriter, r *http.Request) {
	dc := callerDC(r.Context())
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxSummaryBytes+1))
	if err != nil {
		http.Error(w, "reading summary: "+err.Error(), http.StatusBadRequest)
		return
	}
	var s Summary
	if err := s.UnmarshalBinary(b); err != nil {
		f.m.badSummaries.WithLabelValues("malformed").Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if s.DC != dc {
		f.m.badSummaries.WithLabelValues("wrong_dc").Inc()
		http.Error(w, fmt.Sprintf("%v: summary for %q from %q", ErrSummaryDC, s.DC, dc), http.StatusForbidden)
		return
	}
	router := r.Header.Get(RouterHeader)
	if err := checkRouterName(router); err != nil {
		f.m.badSummaries.WithLabelValues("malformed").Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	models := make(map[string]ModelSummary, len(s.Models))
	for _, m := range s.Models {
		if err := m.Prefixes.Check(filterLimits); err != nil {
			f.m.badSummaries.WithLabelValues("filter").Inc()
			http.Error(w, fmt.Sprintf("federation: model %q: prefix filter refused: %v", m.Model, err), http.StatusBadRequest)
			return
		}
		models[m.Model] = m
	}
	now, fresh := f.cfg.now(), f.cfg.Policy().SummaryStale
	f.mu.Lock()
	if _, known := f.remote[s.DC]; !known && len(f.remote) >= maxRemoteDCs {
		f.mu.Unlock()
		f.m.badSummaries.WithLabelValues("too_many_dcs").Inc()
		http.Error(w, "federation: too many datacenters", http.StatusServiceUnavailable)
		return
	}
	if !f.remoteLocked(s.DC).store(router, models, now, fresh) {
		f.mu.Unlock()
		f.m.badSummaries.WithLabelValues("too_many_routers").Inc()
		http.Error(w, "federation: too many routers in that datacenter", http.StatusServiceUnavailable)
		return
	}
	f.mu.Unlock()
	f.m.summaries.WithLabelValues(s.DC).Inc()
	w.WriteHeader(http.StatusNoContent)
}

// filterLimits bound a summary's prefix filters: what New makes for up to
// maxFilterBytes, and no fuller than a 5% false-positive rate (an all-ones
// filter would pull every request across).
var filterLimits = func() bloom.Limits {
	l := bloom.DefaultLimits()
	l.MaxBits = maxFilterBytes * 8
	return l
}()

func (f *Federation) remoteLocked(dc string) *remoteDC {
	rd := f.remote[dc]
	if rd == nil {
		rd = &remoteDC{live: scoring.NewLive()}
		f.remote[dc] = rd
	}
	return rd
}
