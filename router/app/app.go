// Package app assembles oasis-router from its packages: discovery feeding
// the engine pool, the routing policy, the cache state behind the prefix
// and ttft terms, API keys, the gateway, and the HTTP server in front of it
// (TLS and HTTP/2 when configured). cmd/oasis-router only parses flags into
// a Config and runs an App until a signal.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"
	"sync/atomic"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/trace"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/tlsfiles"
	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/gateway"
	"github.com/oasis-llm/oasis/router/gomaxprocs"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/peers"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// App is one assembled router. New builds it without starting anything but
// its listener; Run serves until its context ends, then drains.
type App struct {
	cfg Config
	log hclog.Logger
	reg *prometheus.Registry
	m   *metrics.Metrics

	consul *consulapi.Client // nil when nothing needs Consul
	nomad  *nomadapi.Client  // nil when nothing needs Nomad

	cache   *cachestate.State
	terms   *scoring.Registry
	pool    *discovery.Pool
	policy  gateway.PolicySource
	watcher *policy.Watcher // Consul KV policy; nil with PolicyFile
	auth    *auth.Authenticator
	engines *http.Transport // to engines: proxying, metrics scraping, /tokenize
	// enginesReady publishes engines to the mesh identity's watch, which
	// starts before the transport exists.
	enginesReady atomic.Pointer[http.Transport]
	gw           *gateway.Gateway
	admission    *admission.Controller
	peers        *peers.Peers           // nil without -peers-listen
	fed          *federation.Federation // nil without -federation-listen
	// forwarded serves what other datacenters' routers forward (the
	// gateway's ForwardedHandler, once built).
	forwarded http.Handler
	tls       *tlsfiles.Files        // nil without TLS
	mesh      *meshid.Identity       // nil without -mesh-service
	procs     *gomaxprocs.Controller // nil unless AdaptiveGOMAXPROCS
	// tracer is the gateway's tracer provider (nil: no tracing);
	// tracerShutdown flushes the one initTracing built.
	tracer         trace.TracerProvider
	tracerShutdown func(context.Context) error

	ln  net.Listener // nil with -listen off
	srv *http.Server

	meshLn  net.Listener // nil without -mesh-listen
	meshSrv *http.Server

	// bg is the context of the background work (discovery, watchers,
	// scraping, cache state subscriptions): it outlives the serving context
	// so that in-flight requests drain with everything still running.
	bg       context.Context
	bgCancel context.CancelFunc
	bgWG     sync.WaitGroup
}

// New validates cfg, builds the router and binds its listener. Errors name
// the flag at fault (*ConfigError). Call Run, or Close if it will not run.
func New(cfg Config) (*App, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: cfg.Logger}
	a.bg, a.bgCancel = context.WithCancel(context.Background())
	steps := []func() error{a.initMetrics, a.initClients, a.initMesh, a.initPool, a.initPolicy, a.initAuth,
		a.initFederation, a.initTracing, a.initAdmission, a.initGateway, a.initTLS, a.initServer, a.initPeers}
	for _, step := range steps {
		if err := step(); err != nil {
			a.Close()
			return nil, err
		}
	}
	return a, nil
}

// Close releases an App that will not Run (or has run).
func (a *App) Close() error {
	a.bgCancel()
	a.bgWG.Wait()
	var errs []error
	if a.fed != nil {
		errs = append(errs, a.fed.Close())
	}
	if a.peers != nil {
		a.peers.Close()
	}
	if a.cache != nil {
		errs = append(errs, a.cache.Close())
	}
	if a.engines != nil {
		a.engines.CloseIdleConnections()
	}
	if a.mesh != nil {
		errs = append(errs, a.mesh.Close())
	}
	if err := a.closeTracing(); err != nil {
		errs = append(errs, err)
	}
	for _, ln := range []net.Listener{a.ln, a.meshLn} {
		if ln != nil {
			if err := ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

// ReloadAPIKeys re-reads Config.APIKeysFile (main calls it on SIGHUP). A
// file that does not load leaves the current keys in force.
func (a *App) ReloadAPIKeys() error {
	if a.cfg.APIKeysFile == "" {
		return nil
	}
	if err := a.auth.LoadFile(a.cfg.APIKeysFile); err != nil {
		a.m.KeyReloads.WithLabelValues("rejected").Inc()
		a.log.Error("reloading API keys failed; keeping current keys", "error", err)
		return err
	}
	a.m.KeyReloads.WithLabelValues("ok").Inc()
	a.log.Info("reloaded API keys", "count", a.auth.Len())
	return nil
}

func (a *App) initMetrics() error {
	a.reg = a.cfg.Registry
	if a.reg == nil {
		a.reg = prometheus.NewRegistry()
		a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	a.m = metrics.New(a.reg)
	if a.cfg.AdaptiveGOMAXPROCS {
		// Its maximum defaults to the runtime's count: the CPUs available,
		// or $GOMAXPROCS where set.
		pc, err := gomaxprocs.New(gomaxprocs.Config{Logger: a.log.Named("gomaxprocs"), Registerer: a.reg})
		if err != nil {
			return fmt.Errorf("GOMAXPROCS controller: %w", err)
		}
		a.procs = pc
	}
	return nil
}

// initClients makes the Consul and Nomad clients the configuration needs.
func (a *App) initClients() error {
	c := a.cfg
	var err error
	if c.Discovery == DiscoveryConsul || c.PolicyFile == "" || c.APIKeysKV || c.Register || c.MeshService != "" || c.PeersListen != "" ||
		(c.FederationListen != "" && c.Discovery != DiscoveryStatic) {
		cc := consulapi.DefaultConfig()
		if c.ConsulAddr != "" {
			cc.Address = c.ConsulAddr
		}
		if a.consul, err = consulapi.NewClient(cc); err != nil {
			return flagErr("-consul-addr", "creating Consul client: %w", err)
		}
	}
	if c.Discovery == DiscoveryNomad || c.PowerFromNomad {
		nc := nomadapi.DefaultConfig()
		if c.NomadAddr != "" {
			nc.Address = c.NomadAddr
		}
		if a.nomad, err = nomadapi.NewClient(nc); err != nil {
			return flagErr("-nomad-addr", "creating Nomad client: %w", err)
		}
	}
	return nil
}

// initPool builds the cache state, the scoring terms over it, and the pool
// whose changes the cache state follows.
func (a *App) initPool() error {
	a.cache = cachestate.New(cachestate.Config{Logger: a.log.Named("cachestate"), PresenceCapacity: a.cfg.KVCachedMaxBlocks,
		MaxIndexBlocks: a.cfg.IndexMaxBlocks, MaxWorkerBlocks: a.cfg.IndexWorkerMaxBlocks, Metrics: a.m})
	var err error
	// Adding a term: one file in router/scoring and one entry here.
	if a.terms, err = scoring.RouterRegistry(a.cache); err != nil {
		return err
	}
	// Upstreams alone first, so that an error names the flag at fault.
	if _, err := discovery.ParseHostedPolicy(a.cfg.HostedUpstreams, nil); err != nil {
		return flagErr("-hosted-upstreams", "%w", err)
	}
	hosted, err := discovery.ParseHostedPolicy(a.cfg.HostedUpstreams, a.cfg.HostedKeyEnvs)
	if err != nil {
		return flagErr("-hosted-key-envs", "%w", err)
	}
	// The listeners are bound (initServer) before discovery first calls
	// isSelf (Run).
	a.pool = discovery.New(discovery.Config{Hosted: hosted, IsSelf: a.isSelf, Logger: a.log.Named("discovery"), Metrics: a.m})
	a.pool.OnChange(a.poolChanged)
	return nil
}

// poolChanged follows a new worker list: the workers gauge and the cache
// state's engines (event subscriptions start and stop here).
func (a *App) poolChanged(ws []*scoring.Worker) {
	a.m.Workers.Reset()
	engines := make([]cachestate.Engine, 0, len(ws))
	for _, w := range ws {
		a.m.Workers.WithLabelValues(w.Model).Inc()
		engines = append(engines, cachestate.Engine{ID: w.ID, Model: w.Model, Address: w.Address,
			BlockSize: w.BlockSize, KVEvents: w.KVEventsEndpoint, KVEventsReplay: w.KVEventsReplay, Node: w.Node,
			KVCapacity: w.KVCapacity})
	}
	a.cache.Sync(a.bg, engines)
	a.log.Info("engine pool changed", "workers", len(ws))
}

// initPolicy reads the fixed policy file, or prepares the Consul KV watcher.
func (a *App) initPolicy() error {
	if a.cfg.PolicyFile == "" {
		w, err := policy.NewWatcher(policy.WatcherConfig{Client: a.consul, Key: a.cfg.KVPrefix + "/policy",
			Terms: a.terms, Metrics: a.m, Logger: a.log})
		if err != nil {
			return err
		}
		a.watcher, a.policy = w, w
		return nil
	}
	data, err := os.ReadFile(a.cfg.PolicyFile)
	if err != nil {
		return flagErr("-policy-file", "%w", err)
	}
	doc, err := policy.Parse(data, a.terms)
	if err != nil {
		return flagErr("-policy-file", "%s: %w", a.cfg.PolicyFile, err)
	}
	a.policy = gateway.StaticPolicy{Doc: doc}
	return nil
}

func (a *App) initAuth() error {
	switch {
	case a.cfg.APIKeysFile != "":
		a.auth = auth.New()
		a.auth.Tokens = a.m.KeyTokens
		if err := a.auth.LoadFile(a.cfg.APIKeysFile); err != nil {
			return flagErr("-api-keys-file", "loading API keys: %w", err)
		}
	case a.cfg.APIKeysKV:
		a.auth = auth.New()
		a.auth.Tokens = a.m.KeyTokens
	}
	return nil
}

// initTLS loads the listener's certificate files.
func (a *App) initTLS() error {
	if a.cfg.TLSCert == "" {
		return nil
	}
	f, err := tlsfiles.New(tlsfiles.Config{CertFile: a.cfg.TLSCert, KeyFile: a.cfg.TLSKey, ClientCAFile: a.cfg.TLSClientCA,
		Logger: a.log.Named("tls"), Registerer: a.reg, Namespace: "oasis_router"})
	if err != nil {
		var fe *tlsfiles.FileError
		if errors.As(err, &fe) {
			return &ConfigError{Flag: tlsFlag(fe.Field), Err: err}
		}
		return fmt.Errorf("TLS: %w", err)
	}
	a.tls = f
	return nil
}
