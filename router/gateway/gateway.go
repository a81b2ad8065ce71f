// Package gateway is oasis-router's HTTP front: the OpenAI-compatible API,
// admission, worker choice and the streaming reverse proxy to engines. It is
// an http.Handler served by net/http (HTTP/1.1, and HTTP/2 over TLS), and it
// reaches engines through net/http's Transport.
package gateway

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// PolicySource returns the current policy document (policy.Watcher).
type PolicySource interface{ Current() *policy.Document }

// StaticPolicy serves a fixed document.
type StaticPolicy struct{ Doc *policy.Document }

// Current returns the fixed document.
func (s StaticPolicy) Current() *policy.Document { return s.Doc }

// DeadlineHeader optionally bounds a request's total time, in milliseconds,
// queueing included. Past it before the first byte the router answers 504.
const DeadlineHeader = "X-Oasis-Deadline-Ms"

// Config configures a Gateway.
type Config struct {
	Pool      *discovery.Pool
	Policy    PolicySource
	Selector  *scoring.Selector
	Admission *admission.Controller
	Metrics   *metrics.Metrics    // the router's instruments
	Gatherer  prometheus.Gatherer // served at /metrics; nil: no /metrics
	Logger    hclog.Logger        // nil: no logs

	// Auth, when set, requires an API key on /v1/*.
	Auth *auth.Authenticator

	// MaxBodyBytes bounds a request body (default 16 MiB; 413 above).
	MaxBodyBytes int64
	// BodyReadTimeout bounds the time a client takes to send its body
	// (default 30 s; 408 after), so a slow client cannot hold a connection
	// and its goroutine open indefinitely.
	BodyReadTimeout time.Duration

	// Transport reaches engines (default NewEngineTransport with its defaults).
	Transport http.RoundTripper
	// HostedTransport reaches hosted OpenAI-compatible APIs over HTTPS
	// (default: net/http's, honouring the proxy environment).
	HostedTransport http.RoundTripper

	// Prepare, when set, may fill the scoring request (e.g. its Tokenize func)
	// before the worker is chosen.
	Prepare func(*scoring.Request)
	// OnPick, when set, is told every choice before the request is sent.
	// It runs on the request path: keep it short.
	OnPick func(ctx context.Context, cfg scoring.Config, req *scoring.Request, w *scoring.Worker)
	// OnAccept, when set, is told every engine that accepted a request (its
	// answer's head is a 2xx): approximate cache learning, which must not
	// learn prompts an engine refused. On the request path: keep it short.
	OnAccept func(ctx context.Context, cfg scoring.Config, req *scoring.Request, w *scoring.Worker)
	// OnRefuse, when set, is told every engine that did not take a request
	// it was picked for (no answer, or an error status): what OnPick
	// credited it with is taken back. On the request path: keep it short.
	OnRefuse func(ctx context.Context, cfg scoring.Config, req *scoring.Request, w *scoring.Worker)

	// CORS, when set, lets browser pages of its origins call the API
	// (cors.go); nil: no CORS headers, preflights get 405.
	CORS *CORS

	// Federation, when set, may send requests to other datacenters' routers
	// (see federate.go). Requests it marks as forwarded are served here.
	Federation *federation.Federation

	// TracerProvider, when set, traces every API request (tracing.go);
	// nil: no tracing, at no cost.
	TracerProvider trace.TracerProvider

	// EjectAfter connect failures in a row keep a worker out of routing for
	// EjectFor (eject.go), until its health check fails in Consul or one
	// probe a period connects again. Defaults: DefaultEjectAfter,
	// DefaultEjectFor; EjectAfter < 0 turns ejection off.
	EjectAfter int
	EjectFor   time.Duration

	// ResponseIDKey authenticates the Responses API ids the router mints
	// (responses.go); every router replica of a datacenter needs the same
	// key (at least MinResponseIDKey bytes). nil: a random key per process,
	// so ids name their engine only until this router restarts, and only
	// on this replica.
	ResponseIDKey []byte

	// MaxLoadedAdapters bounds the LoRA adapters this router loads on one
	// engine on demand (adapters.go); default DefaultMaxLoadedAdapters.
	MaxLoadedAdapters int
}

// Gateway serves the router's HTTP API.
type Gateway struct {
	cfg      Config
	log      hclog.Logger
	m        *metrics.Metrics
	draining atomic.Bool
	mux      *http.ServeMux
	bufs     sync.Pool // *[]byte relay buffers
	ids      *requestIDs
	ttft     ttftWindows
	service  serviceTimes
	tr       *tracing // nil: tracing off
	hop      hopMark  // this router's Via entry (hop.go)
	cards    engineCards
	respIDs  *responseIDs
	adapters adapterLoads
	cold     *coldStarts // requests held for models scaled to zero (coldstart.go)
}

// New validates c and returns a gateway.
func New(c Config) (*Gateway, error) {
	switch {
	case c.Pool == nil:
		return nil, errors.New("gateway: Config.Pool is required")
	case c.Policy == nil:
		return nil, errors.New("gateway: Config.Policy is required")
	case c.Selector == nil:
		return nil, errors.New("gateway: Config.Selector is required")
	case c.Admission == nil:
		return nil, errors.New("gateway: Config.Admission is required")
	case c.Metrics == nil:
		return nil, errors.New("gateway: Config.Metrics is required")
	case c.MaxBodyBytes < 0:
		return nil, errors.New("gateway: Config.MaxBodyBytes must be ≥ 0")
	case c.BodyReadTimeout < 0:
		return nil, errors.New("gateway: Config.BodyReadTimeout must be ≥ 0")
	case c.EjectFor < 0:
		return nil, errors.New("gateway: Config.EjectFor must be ≥ 0")
	case c.MaxLoadedAdapters < 0:
		return nil, errors.New("gateway: Config.MaxLoadedAdapters must be ≥ 0")
	}
	if c.MaxLoadedAdapters == 0 {
		c.MaxLoadedAdapters = DefaultMaxLoadedAdapters
	}
	if c.EjectAfter == 0 {
		c.EjectAfter = DefaultEjectAfter
	}
	if c.EjectFor == 0 {
		c.EjectFor = DefaultEjectFor
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 16 << 20
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = 30 * time.Second
	}
	if c.Transport == nil {
		c.Transport = NewEngineTransport(EngineTransportConfig{})
	}
	if c.HostedTransport == nil {
		c.HostedTransport = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true,
			TLSHandshakeTimeout: 10 * time.Second, IdleConnTimeout: 90 * time.Second, MaxIdleConnsPerHost: 64}
	}
	respIDs, err := newResponseIDs(c.ResponseIDKey)
	if err != nil {
		return nil, err
	}
	m := c.Metrics
	if c.Admission.OnQueue == nil {
		c.Admission.OnQueue = func(model string, n int) { m.Queued.WithLabelValues(model).Set(float64(n)) }
	}
	g := &Gateway{cfg: c, log: c.Logger.Named("gateway"), m: m, ids: newRequestIDs(),
		tr: newTracing(c.TracerProvider), hop: newHopMark(), respIDs: respIDs, cold: newColdStarts()}
	c.Pool.OnChange(g.cold.poolChanged)
	g.bufs.New = func() any { b := make([]byte, 32<<10); return &b }
	g.mux = g.routes()
	return g, nil
}

func (g *Gateway) routes() *http.ServeMux {
	mux := http.NewServeMux()
	proxy := g.authenticated(http.HandlerFunc(g.proxy))
	for _, p := range modelPaths {
		mux.Handle("POST "+p, proxy)
	}
	mux.Handle("GET /version", g.authenticated(http.HandlerFunc(g.version)))
	mux.Handle("GET /v1/models", g.authenticated(http.HandlerFunc(g.models)))
	mux.Handle("GET /v1/models/{id...}", g.authenticated(http.HandlerFunc(g.model)))
	stored := g.authenticated(http.HandlerFunc(g.storedResponse))
	mux.Handle("GET /v1/responses/{id}", stored)
	mux.Handle("POST /v1/responses/{id}/cancel", stored)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /ready", g.ready)
	if g.cfg.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(g.cfg.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", g.unknownRoute)
	return mux
}

// ForwardedHandler serves requests other datacenters' routers forward,
// behind the federation listener that authenticated them by certificate:
// the client's API key was checked, and its rate limit applied, where the
// request entered. They are served here, never forwarded again.
func (g *Gateway) ForwardedHandler() http.Handler {
	mux := http.NewServeMux()
	for _, p := range modelPaths {
		mux.HandleFunc("POST "+p, g.proxy)
	}
	mux.HandleFunc("/", g.unknownRoute)
	return mux
}

// EngineTransportConfig tunes the transport to engines.
type EngineTransportConfig struct {
	DialTimeout         time.Duration // default 2 s
	IdleConnTimeout     time.Duration // idle connections are closed after this (default 90 s)
	MaxIdleConnsPerHost int           // default 1024
	// TLS, when set, wraps every connection to an engine in TLS with this
	// configuration while URLs stay http:// (the router in the service
	// mesh dials each engine's sidecar, or a Connect-native engine, with its
	// own leaf certificate; meshid's ClientConfig verifies the engine's
	// service identity). The handshake is bounded by DialTimeout too.
	TLS *tls.Config
}

// NewEngineTransport returns net/http's Transport tuned for engines on the
// cluster's network: no proxy, no compression (bodies pass through as the
// engine wrote them), a large idle pool per engine, HTTP/1.1 (engines serve
// no HTTP/2). The response-header timeout is the gateway's, per model
// (policy timeouts), not the transport's. Idle connections an engine closes
// are noticed and dropped by the transport at once; the rest expire after
// IdleConnTimeout.
func NewEngineTransport(c EngineTransportConfig) *http.Transport {
	if c.DialTimeout <= 0 {
		c.DialTimeout = 2 * time.Second
	}
	if c.IdleConnTimeout <= 0 {
		c.IdleConnTimeout = 90 * time.Second
	}
	if c.MaxIdleConnsPerHost <= 0 {
		c.MaxIdleConnsPerHost = 1024
	}
	dialer := &net.Dialer{Timeout: c.DialTimeout, KeepAlive: 30 * time.Second}
	dial := dialer.DialContext
	if c.TLS != nil {
		dial = tlsDialer(dialer, c.TLS, c.DialTimeout)
	}
	return &http.Transport{
		DialContext:         dial,
		MaxIdleConnsPerHost: c.MaxIdleConnsPerHost,
		IdleConnTimeout:     c.IdleConnTimeout,
		DisableCompression:  true,
		// Prompts can be large: write them in few system calls.
		WriteBufferSize: 64 << 10,
	}
}

// tlsDialer dials and completes a TLS handshake within timeout.
func tlsDialer(d *net.Dialer, tc *tls.Config, timeout time.Duration) func(context.Context, string, string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		raw, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		conn := tls.Client(raw, tc)
		if err := conn.HandshakeContext(ctx); err != nil {
			raw.Close()
			return nil, &HandshakeError{Addr: addr, Err: err}
		}
		return conn, nil
	}
}

// HandshakeError is a TLS handshake with an engine (or its sidecar) that
// failed: no request was sent.
type HandshakeError struct {
	Addr string
	Err  error
}

func (e *HandshakeError) Error() string { return "TLS handshake with " + e.Addr + ": " + e.Err.Error() }
func (e *HandshakeError) Unwrap() error { return e.Err }

// ServeHTTP implements http.Handler.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if g.cors(w, r) {
		return // a preflight, answered before authentication (cors.go)
	}
	g.mux.ServeHTTP(w, r)
}

// Drain makes /ready fail so load balancers stop sending; in-flight requests
// continue (http.Server.Shutdown waits for them).
func (g *Gateway) Drain() { g.draining.Store(true) }

func (g *Gateway) ready(w http.ResponseWriter, _ *http.Request) {
	switch {
	case g.draining.Load():
		writeError(w, http.StatusServiceUnavailable, "server_error", "draining", "", "router is shutting down", 0)
	case len(g.cfg.Pool.All()) == 0:
		writeError(w, http.StatusServiceUnavailable, "server_error", "no_healthy_worker", "", "no healthy engine instance known", 0)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ready"}` + "\n"))
	}
}

type ctxKey struct{}

func (g *Gateway) authenticated(next http.Handler) http.Handler {
	if g.cfg.Auth == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, err := g.cfg.Auth.Authenticate(r)
		if err != nil {
			g.m.AuthFailures.Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="oasis"`)
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "", err.Error(), 0)
			return
		}
		if ok, wait := g.cfg.Auth.Allow(k); !ok {
			g.m.RateLimited.Inc()
			writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "",
				"rate limit reached for API key "+strconv.Quote(k.ID), wait)
			return
		}
		// The key's tenant and band order the admission queue (router/admission Class).
		ctx := admission.WithClass(context.WithValue(r.Context(), ctxKey{}, k), admission.Class{Tenant: k.ID, Priority: k.Priority()})
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}
