// Command oasis-router is the OpenAI-compatible gateway in front of Oasis
// engines: it discovers engines in Consul (or Nomad), routes each request by
// the policy document in Consul KV, and streams the engine's answer back.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/auth"
	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/gateway"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/procs"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/router/signals"
	"github.com/oasis-llm/oasis/router/tokens"
)

type config struct {
	listen          string
	discovery       string
	consulAddr      string
	nomadAddr       string
	service         string
	serviceTag      string
	kvPrefix        string
	engines         string
	policyFile      string
	apiKeysFile     string
	apiKeysKV       bool
	maxBody         int64
	scrapeInterval  time.Duration
	powerFromNomad  bool
	register        bool
	advertise       string
	shutdownTimeout time.Duration
	logLevel        string
	logJSON         bool
	pprofListen     string
	kvcachedService string
	kvcachedBlocks  int
	gcPercent       int
	memoryLimit     int64
	gomaxprocs      int
}

func main() {
	var c config
	fs := flag.NewFlagSet("oasis-router", flag.ExitOnError)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address to serve the API on (loopback unless you mean otherwise)")
	fs.StringVar(&c.discovery, "discovery", "consul", "engine discovery: consul (health API), nomad (native service discovery) or static (-engines)")
	fs.StringVar(&c.consulAddr, "consul-addr", "", "Consul HTTP address (default $CONSUL_HTTP_ADDR or 127.0.0.1:8500); $CONSUL_HTTP_TOKEN is honoured")
	fs.StringVar(&c.nomadAddr, "nomad-addr", "", "Nomad HTTP address (default $NOMAD_ADDR); used by -discovery=nomad and -power-from-nomad")
	fs.StringVar(&c.service, "service", discovery.EngineService, "engine service name")
	fs.StringVar(&c.serviceTag, "service-tag", "", "only engines with this tag (consul discovery)")
	fs.StringVar(&c.kvPrefix, "kv-prefix", "oasis/router", "Consul KV prefix: <prefix>/policy holds the policy, <prefix>/keys the API keys")
	fs.StringVar(&c.engines, "engines", "", "static engines for -discovery=static: model=host:port[,model=host:port...]")
	fs.StringVar(&c.policyFile, "policy-file", "", "read the policy from this file (JSON or HCL) instead of Consul KV (no live reload)")
	fs.StringVar(&c.apiKeysFile, "api-keys-file", "", "enable API keys from this JSON file of sha256 digests (reloaded on SIGHUP)")
	fs.BoolVar(&c.apiKeysKV, "api-keys-kv", false, "enable API keys from Consul KV <prefix>/keys (watched)")
	fs.Int64Var(&c.maxBody, "max-body-bytes", 16<<20, "largest request body accepted (413 above)")
	fs.DurationVar(&c.scrapeInterval, "scrape-interval", time.Second, "how often engine metrics are scraped (0 disables)")
	fs.BoolVar(&c.powerFromNomad, "power-from-nomad", false, "read GPU power per node from Nomad's node stats (DeviceStats)")
	fs.BoolVar(&c.register, "register", false, "register this router in Consul as service oasis-router with an HTTP check on /health")
	fs.StringVar(&c.advertise, "advertise", "", "host:port to register (default: the bound -listen address)")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 60*time.Second, "how long SIGTERM waits for in-flight streams to finish")
	fs.StringVar(&c.logLevel, "log-level", "info", "trace, debug, info, warn, error")
	fs.BoolVar(&c.logJSON, "log-json", false, "log JSON lines")
	fs.StringVar(&c.pprofListen, "pprof-listen", "", "serve net/http/pprof on this address (off by default; keep it on loopback)")
	fs.IntVar(&c.kvcachedBlocks, "kvcached-max-blocks", cachestate.DefaultPresenceCapacity, "most blocks tracked from kvcached presence events (each costs one index entry per event-driven engine)")
	fs.StringVar(&c.kvcachedService, "kvcached-service", discovery.KVCachedService, "Consul service of the node-local kvcached instances whose presence events count offloaded prefixes as CPU/disk/peer hits (empty: ignore them)")
	fs.IntVar(&c.gcPercent, "gc-percent", 400, "Go GC target percentage (runtime/debug.SetGCPercent): the router's live heap is a few MiB, so collecting less often trades a little memory for CPU per request; -1 disables GC except under -memory-limit")
	fs.IntVar(&c.gomaxprocs, "gomaxprocs", 0, "threads running Go code at once (runtime.GOMAXPROCS); 0 sizes them to the router's CPU use, from 1 up to the CPUs available (as does a GOMAXPROCS environment variable, which is then the most used); N > 0 fixes them at N")
	fs.Int64Var(&c.memoryLimit, "memory-limit", 0, "soft memory limit in bytes for the Go runtime (runtime/debug.SetMemoryLimit); 0 leaves the runtime's default")
	_ = fs.Parse(os.Args[1:])
	// Set in code from flags, not from GOGC/GOMEMLIMIT, so what the router
	// runs with is visible on its command line.
	debug.SetGCPercent(c.gcPercent)
	if c.memoryLimit > 0 {
		debug.SetMemoryLimit(c.memoryLimit)
	}
	if c.gomaxprocs > 0 {
		runtime.GOMAXPROCS(c.gomaxprocs)
	}

	log := hclog.New(&hclog.LoggerOptions{Name: "oasis-router", Level: hclog.LevelFromString(c.logLevel), JSONFormat: c.logJSON})
	if err := run(c, log); err != nil {
		log.Error("exiting", "error", err)
		os.Exit(1)
	}
}

func run(c config, log hclog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m := metrics.New(reg)

	var wg sync.WaitGroup
	bgCtx, bgCancel := context.WithCancel(context.Background())
	bg := func(f func()) {
		wg.Add(1)
		go func() { defer wg.Done(); f() }()
	}
	defer func() { bgCancel(); wg.Wait() }()

	if c.gomaxprocs <= 0 {
		// Max defaults to the runtime's count: the CPUs available, or
		// $GOMAXPROCS where set.
		pc, err := procs.New(procs.Config{Logger: log.Named("procs"), Registerer: reg})
		if err != nil {
			return err
		}
		bg(func() { pc.Run(bgCtx) })
	}

	// KV-cache state (engines' KV events, or the router's own decisions for
	// engines without events) behind the prefix term.
	cache := cachestate.New(cachestate.Config{Logger: log.Named("cachestate"), PresenceCapacity: c.kvcachedBlocks})
	defer cache.Close()

	// Scoring terms. Adding a term: one file in router/scoring and one entry here.
	terms, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.CacheTerms(cache)...)...)
	if err != nil {
		return err
	}

	var consul *consulapi.Client
	if c.discovery == "consul" || c.policyFile == "" || c.apiKeysKV || c.register {
		cc := consulapi.DefaultConfig()
		if c.consulAddr != "" {
			cc.Address = c.consulAddr
		}
		if consul, err = consulapi.NewClient(cc); err != nil {
			return fmt.Errorf("creating Consul client: %w", err)
		}
	}
	var nomad *nomadapi.Client
	if c.discovery == "nomad" || c.powerFromNomad {
		nc := nomadapi.DefaultConfig()
		if c.nomadAddr != "" {
			nc.Address = c.nomadAddr
		}
		if nomad, err = nomadapi.NewClient(nc); err != nil {
			return fmt.Errorf("creating Nomad client: %w", err)
		}
	}

	pool := discovery.NewPool()
	pool.OnChange(func(ws []*scoring.Worker) {
		m.Workers.Reset()
		engines := make([]cachestate.Engine, 0, len(ws))
		for _, w := range ws {
			m.Workers.WithLabelValues(w.Model).Inc()
			engines = append(engines, cachestate.Engine{ID: w.ID, Model: w.Model, Address: w.Address,
				BlockSize: w.BlockSize, KVEvents: w.KVEventsEndpoint, KVEventsReplay: w.KVEventsReplay, Node: w.Node})
		}
		cache.Sync(bgCtx, engines)
		log.Info("engine pool changed", "workers", len(ws))
	})
	if consul != nil && c.kvcachedService != "" {
		// kvcached registers in Consul (jobs/kvcached.nomad.hcl) whatever the engines use.
		src := &discovery.Consul{Client: consul, Service: c.kvcachedService, Log: log}
		bg(func() {
			src.Watch(bgCtx, func(ins []discovery.Instance) {
				kcs := discovery.KVCachesOf(ins)
				caches := make([]cachestate.KVCache, len(kcs))
				for i, k := range kcs {
					caches[i] = cachestate.KVCache{ID: k.ID, Address: k.Address, Node: k.Node,
						KVEvents: k.KVEvents, KVEventsReplay: k.KVEventsReplay}
				}
				cache.SyncKVCaches(bgCtx, caches)
			})
		})
	}
	switch c.discovery {
	case "consul":
		src := &discovery.Consul{Client: consul, Service: c.service, Tag: c.serviceTag, Log: log, Metrics: m}
		bg(func() { src.Run(bgCtx, pool) })
	case "nomad":
		src := &discovery.Nomad{Client: nomad, Service: c.service, Log: log, Metrics: m}
		bg(func() { src.Run(bgCtx, pool) })
	case "static":
		ins, err := parseEngines(c.engines)
		if err != nil {
			return err
		}
		pool.Set(ins)
	default:
		return fmt.Errorf("-discovery: want consul, nomad or static, got %q", c.discovery)
	}

	var pol gateway.PolicySource
	if c.policyFile != "" {
		data, err := os.ReadFile(c.policyFile)
		if err != nil {
			return fmt.Errorf("reading policy file: %w", err)
		}
		doc, err := policy.Parse(data, terms)
		if err != nil {
			return fmt.Errorf("policy file %s: %w", c.policyFile, err)
		}
		pol = gateway.StaticPolicy{Doc: doc}
	} else {
		w := policy.NewWatcher(consul, strings.TrimSuffix(c.kvPrefix, "/")+"/policy", terms, m, log)
		bg(func() { w.Run(bgCtx) })
		pol = w
	}

	var authn *auth.Authenticator
	switch {
	case c.apiKeysFile != "" && c.apiKeysKV:
		return errors.New("-api-keys-file and -api-keys-kv are exclusive")
	case c.apiKeysFile != "":
		authn = auth.New()
		if err := authn.LoadFile(c.apiKeysFile); err != nil {
			return fmt.Errorf("loading API keys: %w", err)
		}
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		bg(func() {
			defer signal.Stop(hup)
			for {
				select {
				case <-bgCtx.Done():
					return
				case <-hup:
					if err := authn.LoadFile(c.apiKeysFile); err != nil {
						m.KeyReloads.WithLabelValues("rejected").Inc()
						log.Error("reloading API keys failed; keeping current keys", "error", err)
						continue
					}
					m.KeyReloads.WithLabelValues("ok").Inc()
					log.Info("reloaded API keys", "count", authn.Len())
				}
			}
		})
	case c.apiKeysKV:
		authn = auth.New()
		bg(func() { authn.WatchKV(bgCtx, consul, strings.TrimSuffix(c.kvPrefix, "/")+"/keys", m, log) })
	default:
		if !isLoopback(c.listen) {
			log.Warn("API keys are disabled and the router listens beyond loopback", "listen", c.listen)
		}
	}

	transport := gateway.NewEngineTransport(gateway.EngineTransportConfig{})
	if c.scrapeInterval > 0 {
		sc := &signals.Scraper{Pool: pool, HTTP: &http.Client{Transport: transport}, Interval: c.scrapeInterval,
			Log: log.Named("signals"), Metrics: m}
		if c.powerFromNomad {
			sc.Nomad = nomad
		}
		bg(func() { sc.Run(bgCtx) })
	}

	// Prompt tokens, computed only when a term or the cache learning asks.
	tok := tokens.NewAuto(func(model string) []tokens.Replica {
		ws := pool.Workers(model)
		out := make([]tokens.Replica, len(ws))
		for i, w := range ws {
			out[i] = tokens.Replica{Address: w.Address, Engine: w.Engine}
		}
		return out
	}, &http.Client{Transport: transport, Timeout: 2 * time.Second})

	gw, err := gateway.New(gateway.Config{
		Pool: pool, Policy: pol, Selector: scoring.NewSelector(terms), Admission: admission.New(),
		Metrics: m, Gatherer: reg, Logger: log, Auth: authn, MaxBodyBytes: c.maxBody, Transport: transport,
		Prepare: tok.Prepare,
		OnPick: func(ctx context.Context, cfg scoring.Config, req *scoring.Request, w *scoring.Worker) {
			// Where the prefix term scored the request: count how much of the prompt the
			// chosen worker held, then, for engines without KV events, record the decision
			// as the approximate view of its cache.
			keys, matched, ok := req.PrefixResult(w.ID)
			if !ok || len(keys) == 0 || w.BlockSize <= 0 {
				return
			}
			m.PrefixRequestBlocks.WithLabelValues(w.Model).Add(float64(len(keys)))
			m.PrefixMatchedBlocks.WithLabelValues(w.Model).Add(float64(matched))
			if !cache.EventDriven(w.ID) {
				cache.Record(w.ID, keys)
			}
		},
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		return fmt.Errorf("listening: %w", err)
	}
	srv := &http.Server{Handler: gw, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second,
		MaxHeaderBytes: 1 << 20, ErrorLog: log.StandardLogger(&hclog.StandardLoggerOptions{InferLevels: true})}
	log.Info("serving", "listen", ln.Addr().String(), "discovery", c.discovery, "api_keys", authn != nil)

	var serviceID string
	if c.register {
		if serviceID, err = register(consul, c, ln.Addr().String()); err != nil {
			return err
		}
		log.Info("registered in Consul", "service", "oasis-router", "id", serviceID)
	}

	if c.pprofListen != "" {
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		dbg := &http.Server{Addr: c.pprofListen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { log.Info("pprof listening", "addr", c.pprofListen, "error", dbg.ListenAndServe()) }()
		defer dbg.Close()
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serving: %w", err)
	case <-ctx.Done():
	}
	// Drain: leave Consul first so no new traffic arrives, then let every
	// in-flight stream finish.
	log.Info("shutting down; draining in-flight requests", "timeout", c.shutdownTimeout)
	gw.Drain()
	if serviceID != "" {
		if err := consul.Agent().ServiceDeregister(serviceID); err != nil {
			log.Warn("deregistering from Consul failed", "error", err)
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), c.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		return fmt.Errorf("draining: %w", err)
	}
	log.Info("drained")
	return nil
}

func register(consul *consulapi.Client, c config, bound string) (string, error) {
	adv := c.advertise
	if adv == "" {
		adv = bound
	}
	host, portS, err := net.SplitHostPort(adv)
	if err != nil {
		return "", fmt.Errorf("-advertise: %w", err)
	}
	port, _ := strconv.Atoi(portS)
	id := "oasis-router-" + strings.NewReplacer(":", "-", ".", "-").Replace(adv)
	err = consul.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: id, Name: "oasis-router", Address: host, Port: port, Tags: []string{"oasis"},
		Check: &consulapi.AgentServiceCheck{HTTP: "http://" + adv + "/health", Interval: "5s", Timeout: "2s",
			DeregisterCriticalServiceAfter: "1m"},
	})
	if err != nil {
		return "", fmt.Errorf("registering in Consul: %w", err)
	}
	return id, nil
}

func parseEngines(s string) ([]discovery.Instance, error) {
	var out []discovery.Instance
	for i, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		model, addr, ok := strings.Cut(e, "=")
		if !ok || model == "" {
			return nil, fmt.Errorf("-engines: entry %d %q: want model=host:port", i, e)
		}
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("-engines: entry %d: %w", i, err)
		}
		out = append(out, discovery.Instance{ID: fmt.Sprintf("static-%d-%s", i, addr), Address: addr,
			Meta: map[string]string{discovery.MetaModel: model}})
	}
	if len(out) == 0 {
		return nil, errors.New("-discovery=static needs -engines")
	}
	return out, nil
}

func isLoopback(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
