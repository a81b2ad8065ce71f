// Package gateway is oasis-router's HTTP front: the OpenAI-compatible API,
// admission, worker choice and the streaming reverse proxy to engines.
package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/discovery"
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

// Options configure a Gateway.
type Options struct {
	Pool      *discovery.Pool
	Policy    PolicySource
	Selector  *scoring.Selector
	Admission *admission.Controller
	Metrics   *metrics.Metrics
	Gatherer  prometheus.Gatherer // served at /metrics
	Log       hclog.Logger

	// Auth, when set, requires an API key on /v1/*.
	Auth *auth.Authenticator

	MaxBodyBytes int64         // default 16 MiB
	DialTimeout  time.Duration // default 2s
	// Prepare, when set, may fill the scoring request (e.g. its Tokenize func)
	// before the worker is chosen.
	Prepare func(*scoring.Request)
	// OnPick, when set, is told every choice before the request is sent
	// (approximate cache learning). It runs on the request path: keep it short.
	OnPick func(ctx context.Context, cfg scoring.Config, req *scoring.Request, w *scoring.Worker)
	// Transport overrides the upstream transport (tests).
	Transport http.RoundTripper
	// HostedTransport overrides the transport to hosted endpoints (HTTPS; tests).
	HostedTransport http.RoundTripper
}

// Gateway serves the router's HTTP API.
type Gateway struct {
	opts     Options
	upstream http.RoundTripper
	hosted   http.RoundTripper // hosted OpenAI-compatible APIs, over TLS
	log      hclog.Logger
	m        *metrics.Metrics
	draining atomic.Bool
	started  int64
	mux      *http.ServeMux
	proxyH   http.Handler // the /v1 completion routes' handler, also reached without the mux
	bufs     sync.Pool    // *[]byte response copy buffers
	ids      *requestIDs
}

// New returns a gateway.
func New(o Options) *Gateway {
	if o.MaxBodyBytes == 0 {
		o.MaxBodyBytes = 16 << 20
	}
	if o.DialTimeout == 0 {
		o.DialTimeout = 2 * time.Second
	}
	g := &Gateway{opts: o, log: o.Log.Named("gateway"), m: o.Metrics, started: time.Now().Unix(),
		ids: newRequestIDs()}
	g.bufs.New = func() any { b := make([]byte, 16<<10); return &b }
	if o.Admission.OnQueue == nil {
		o.Admission.OnQueue = func(model string, n int) { o.Metrics.Queued.WithLabelValues(model).Set(float64(n)) }
	}
	g.hosted = o.HostedTransport
	if g.hosted == nil {
		g.hosted = &http.Transport{Proxy: http.ProxyFromEnvironment, ForceAttemptHTTP2: true,
			TLSHandshakeTimeout: 10 * time.Second, IdleConnTimeout: 90 * time.Second, MaxIdleConnsPerHost: 64}
	}
	g.upstream = o.Transport
	if g.upstream == nil {
		g.upstream = NewTransport(o.DialTimeout)
	}
	mux := http.NewServeMux()
	g.proxyH = g.authenticated(http.HandlerFunc(g.proxy))
	for _, p := range []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings"} {
		mux.Handle("POST "+p, g.proxyH)
	}
	mux.Handle("GET /v1/models", g.authenticated(http.HandlerFunc(g.models)))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ok"}` + "\n"))
	})
	mux.HandleFunc("GET /ready", g.ready)
	if o.Gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(o.Gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "unknown_url",
			"", "Unknown request URL: "+r.Method+" "+r.URL.Path, 0)
	})
	g.mux = mux
	return g
}

// NewTransport returns the pooled keep-alive transport used for engines.
func NewTransport(dialTimeout time.Duration) *Transport {
	return &Transport{DialTimeout: dialTimeout, IdleTimeout: 90 * time.Second, MaxIdlePerHost: 4096}
}

// ServeHTTP implements http.Handler.
// The proxied routes, which are clean paths the mux would match exactly,
// skip the mux's path cleaning and pattern lookup.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodPost && r.URL.RawPath == "" {
		switch r.URL.Path {
		case "/v1/chat/completions", "/v1/completions", "/v1/embeddings":
			g.proxyH.ServeHTTP(w, r)
			return
		}
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
	case len(g.opts.Pool.All()) == 0:
		writeError(w, http.StatusServiceUnavailable, "server_error", "no_healthy_worker", "", "no healthy engine instance known", 0)
	default:
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"status":"ready"}` + "\n"))
	}
}

type ctxKey struct{}

func (g *Gateway) authenticated(next http.Handler) http.Handler {
	if g.opts.Auth == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k, err := g.opts.Auth.Authenticate(r)
		if err != nil {
			g.m.AuthFailures.Inc()
			w.Header().Set("WWW-Authenticate", `Bearer realm="oasis"`)
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "", err.Error(), 0)
			return
		}
		if ok, wait := g.opts.Auth.Allow(k); !ok {
			g.m.RateLimited.Inc()
			writeError(w, http.StatusTooManyRequests, "requests", "rate_limit_exceeded", "",
				"rate limit reached for API key "+strconv.Quote(k.ID), wait)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, k)))
	})
}

func (g *Gateway) models(w http.ResponseWriter, _ *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	out := struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{Object: "list", Data: []model{}}
	for _, m := range g.opts.Pool.Models() {
		out.Data = append(out.Data, model{ID: m, Object: "model", Created: g.started, OwnedBy: "oasis"})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
