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
	"github.com/quic-go/quic-go/http3"

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
	DC       string                           // this datacenter (required)
	Consul   *consulapi.Client                // finds peers; nil: only StaticPeers
	Identity Identity                         // mutual TLS (required)
	Listen   string                           // UDP address of the HTTP/3 listener; "" serves none
	Handler  http.Handler                     // serves forwarded requests (required with Listen)
	Policy   func() policy.FederationSettings // the current settings (required)
	// Local returns this datacenter's current figures per model, without
	// Prefixes (the federation adds the hot-prefix filters). Required.
	Local func() []ModelSummary

	// Transport, when set, replaces the HTTP/3 client (its peers then serve
	// Handler on a listener of the same protocol): benchmarks compare
	// HTTP/2 over TLS with it.
	Transport http.RoundTripper

	StaticPeers  []Peer        // peers besides Consul's (tests, fixed topologies)
	Interval     time.Duration // between two summary pushes; default 1s
	PushTimeout  time.Duration // one push; default 1s
	QueryWait    time.Duration // a blocking Consul query's wait; default 5s
	QueryTimeout time.Duration // added to QueryWait for a cross-DC query's deadline; default 2s
	HotKeys      int           // prefix block keys remembered per model; default 1024

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
	h3    *http3.Transport // the default client; closed with the federation
	rt    http.RoundTripper
	peers *peerSet
	rr    atomic.Uint64 // spreads forwards over a datacenter's routers

	mu        sync.Mutex
	static    []Peer               // Config.StaticPeers, or SetStaticPeers'
	remote    map[string]*remoteDC // by datacenter
	hot       map[string]*HotKeys  // by model
	spill     SpillBudget
	closeOnce sync.Once
	ln        net.PacketConn
	srv       *http3.Server
}

// remoteDC is what this router knows of another datacenter.
type remoteDC struct {
	summary  map[string]ModelSummary
	received time.Time // zero: never
	rtt      time.Duration
	breaker  breaker
	live     *scoring.Live // this router's requests in flight there
}

// New validates c and returns a federation; Run starts it.
func New(c Config) (*Federation, error) {
	switch {
	case !validName(c.DC):
		return nil, ErrNoDC
	case c.Identity.Server == nil || c.Identity.Client == nil:
		return nil, ErrNoIdentity
	case c.Policy == nil || c.Local == nil:
		return nil, errors.New("federation: Config.Policy and Config.Local are required")
	case c.Listen != "" && c.Handler == nil:
		return nil, errors.New("federation: Config.Handler is required with Listen")
	}
	for _, p := range c.StaticPeers {
		if !validName(p.DC) || p.DC == c.DC {
			return nil, fmt.Errorf("federation: static peer %q: bad datacenter %q", p.Addr, p.DC)
		}
	}
	setDefaults(&c)
	f := &Federation{cfg: c, log: c.Logger.Named("federation"), h3: c.Identity.clientTransport(),
		peers:  &peerSet{peers: map[string][]Peer{}, stale: map[string]bool{}},
		remote: map[string]*remoteDC{}, hot: map[string]*HotKeys{}, static: c.StaticPeers}
	m, err := newMetrics(c.Registerer)
	if err != nil {
		return nil, err
	}
	f.m, f.rt = m, f.h3
	if c.Transport != nil {
		f.rt = c.Transport
	}
	if c.Identity.PeerDC != nil {
		f.rt = dcChecked{rt: f.rt, f: f}
	}
	if c.Listen != "" {
		if err := f.listen(); err != nil {
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
		{&c.QueryTimeout, 2 * time.Second}} {
		if *d.v <= 0 {
			*d.v = d.def
		}
	}
	if c.HotKeys <= 0 {
		c.HotKeys = 1024
	}
	if c.now == nil {
		c.now = time.Now
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
	f.ln = ln
	f.srv = &http3.Server{TLSConfig: tc, QUICConfig: quicConfig(), Handler: f.serverHandler()}
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
			if err := f.srv.Serve(f.ln); err != nil && !errors.Is(err, http.ErrServerClosed) && ctx.Err() == nil {
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
// as it returns. For a Federation that will not Run.
func (f *Federation) Close() {
	f.closeOnce.Do(func() {
		if f.srv != nil {
			_ = f.srv.Close()
		}
		if f.ln != nil {
			_ = f.ln.Close()
		}
		_ = f.h3.Close()
	})
}

// Handler is what the federation listener serves, for serving it on
// another listener as well.
func (f *Federation) Handler() http.Handler { return f.serverHandler() }

// serverHandler serves the federation listener: summaries, and forwarded
// requests, which are marked so the gateway never forwards them again.
func (f *Federation) serverHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+SummaryPath, f.receive)
	mux.Handle("/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.cfg.Handler.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true)))
	}))
	if auth := f.cfg.Identity.Authorize; auth != nil {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.TLS == nil || auth(*r.TLS) != nil {
				http.Error(w, "federation: caller not authorized", http.StatusForbidden)
				return
			}
			mux.ServeHTTP(w, r)
		})
	}
	return mux
}

// maxRemoteDCs bounds the datacenters a router keeps state for: peers are
// authenticated, but the datacenter a summary names is theirs to choose.
const maxRemoteDCs = 64

type forwardedKey struct{}

// Forwarded reports whether the request with ctx arrived from another
// datacenter's router: it must be served locally.
func Forwarded(ctx context.Context) bool { v, _ := ctx.Value(forwardedKey{}).(bool); return v }

// receive stores a peer's summary.
func (f *Federation) receive(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(io.LimitReader(r.Body, MaxSummaryBytes+1))
	if err != nil {
		http.Error(w, "reading summary: "+err.Error(), http.StatusBadRequest)
		return
	}
	var s Summary
	if err := s.UnmarshalBinary(b); err != nil || s.DC == f.cfg.DC {
		f.m.badSummaries.Inc()
		http.Error(w, "bad summary", http.StatusBadRequest)
		return
	}
	if pdc := f.cfg.Identity.PeerDC; pdc != nil && r.TLS != nil && pdc(*r.TLS) != s.DC {
		f.m.badSummaries.Inc()
		http.Error(w, "the summary's datacenter is not the caller's", http.StatusForbidden)
		return
	}
	models := make(map[string]ModelSummary, len(s.Models))
	for _, m := range s.Models {
		models[m.Model] = m
	}
	now := f.cfg.now()
	f.mu.Lock()
	if _, known := f.remote[s.DC]; !known && len(f.remote) >= maxRemoteDCs {
		f.mu.Unlock()
		f.m.badSummaries.Inc()
		http.Error(w, "too many datacenters", http.StatusBadRequest)
		return
	}
	rd := f.remoteLocked(s.DC)
	rd.summary, rd.received = models, now
	f.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (f *Federation) remoteLocked(dc string) *remoteDC {
	rd := f.remote[dc]
	if rd == nil {
		rd = &remoteDC{live: scoring.NewLive()}
		f.remote[dc] = rd
	}
	return rd
}
