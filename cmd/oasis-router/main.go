// Command oasis-router is the OpenAI-compatible gateway in front of Oasis
// engines: it discovers engines in Consul (or Nomad), routes each request by
// the policy document in Consul KV, and streams the engine's answer back.
// The router is assembled by router/app; this command parses its flags and
// runs it until SIGINT or SIGTERM, then drains. -config FILE|DIR (HCL or
// JSON, repeatable) sets the same settings from files; flags on the command
// line win (router/README.md "Configuration").
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/agentconfig"
	"github.com/oasis-llm/oasis/router/app"
	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/gateway"
	"github.com/oasis-llm/oasis/router/peers"
)

// runtimeFlags are the process-wide settings main applies itself.
type runtimeFlags struct {
	logLevel    string
	logJSON     bool
	gcPercent   int
	memoryLimit int64
	gomaxprocs  int
}

func main() {
	cfg, rt, err := parseFlags(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "oasis-router:", err)
		os.Exit(2)
	}
	// Set in code from flags, not from GOGC/GOMEMLIMIT, so what the router
	// runs with is visible on its command line.
	debug.SetGCPercent(rt.gcPercent)
	if rt.memoryLimit > 0 {
		debug.SetMemoryLimit(rt.memoryLimit)
	}
	if rt.gomaxprocs > 0 {
		runtime.GOMAXPROCS(rt.gomaxprocs)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "oasis-router", Level: hclog.LevelFromString(rt.logLevel), JSONFormat: rt.logJSON})
	cfg.Logger = log
	if err := run(cfg); err != nil {
		log.Error("exiting", "error", err)
		os.Exit(1)
	}
}

// run serves until SIGINT or SIGTERM; SIGHUP reloads -api-keys-file.
func run(cfg app.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	a, err := app.New(cfg)
	if err != nil {
		return err
	}
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-hup:
				_ = a.ReloadAPIKeys() // logged and counted by the app
			}
		}
	}()
	return a.Run(ctx)
}

// parseFlags parses the command line, and the config files its -config
// flags name, into the app's Config and the process-wide settings.
func parseFlags(args []string) (app.Config, runtimeFlags, error) {
	var c app.Config
	var rt runtimeFlags
	var lists listFlags
	var configs agentconfig.Paths
	fs := newFlagSet(&c, &rt, &lists)
	fs.Var(&configs, "config", agentconfig.Usage)
	if err := fs.Parse(args); err != nil {
		return c, rt, err
	}
	if fs.NArg() > 0 {
		return c, rt, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if err := agentconfig.Apply(fs, app.ConfigKeys, configs); err != nil {
		return c, rt, err
	}
	var err error
	if c.Engines, err = app.ParseEngines(lists.engines); err != nil {
		return c, rt, err
	}
	c.HostedUpstreams = discovery.SplitList(lists.hostedUpstreams)
	c.HostedKeyEnvs = discovery.SplitList(lists.hostedKeyEnvs)
	c.CORSOrigins = discovery.SplitList(lists.corsOrigins)
	c.CORSMethods = discovery.SplitList(lists.corsMethods)
	c.CORSHeaders = discovery.SplitList(lists.corsHeaders)
	c.AdaptiveGOMAXPROCS = rt.gomaxprocs <= 0
	return c, rt, nil
}

// listFlags are the flags parsed further after the command line and the
// config files are read.
type listFlags struct {
	engines, hostedUpstreams, hostedKeyEnvs string
	corsOrigins, corsMethods, corsHeaders   string
}

// newFlagSet defines every flag but -config on c, rt and lists, with its
// default; app.ConfigKeys maps the config file's keys onto them.
func newFlagSet(c *app.Config, rt *runtimeFlags, lists *listFlags) *flag.FlagSet {
	engines, hostedUpstreams, hostedKeyEnvs := &lists.engines, &lists.hostedUpstreams, &lists.hostedKeyEnvs
	fs := flag.NewFlagSet("oasis-router", flag.ContinueOnError)
	fs.StringVar(&c.Listen, "listen", app.DefaultListen, "address to serve the API on (loopback unless you mean otherwise); off: none, with -mesh-listen serving mesh clients only")
	fs.StringVar(&c.Discovery, "discovery", app.DiscoveryConsul, "engine discovery: consul (health API), nomad (native service discovery) or static (-engines)")
	fs.StringVar(&c.ConsulAddr, "consul-addr", "", "Consul HTTP address (default $CONSUL_HTTP_ADDR or 127.0.0.1:8500); $CONSUL_HTTP_TOKEN is honoured")
	fs.StringVar(&c.NomadAddr, "nomad-addr", "", "Nomad HTTP address (default $NOMAD_ADDR); used by -discovery=nomad and -power-from-nomad")
	fs.StringVar(&c.Service, "service", discovery.EngineService, "engine service name")
	fs.StringVar(&c.ServiceTag, "service-tag", "", "only engines with this tag (consul discovery)")
	fs.StringVar(&c.KVPrefix, "kv-prefix", app.DefaultKVPrefix, "Consul KV prefix: <prefix>/policy holds the policy, <prefix>/keys the API keys")
	fs.StringVar(engines, "engines", "", "static engines for -discovery=static: model=host:port[@engine][,...]; @engine sets oasis_engine (e.g. @sim: oasis-sim's tokenizer, no /tokenize round trip)")
	fs.StringVar(&c.PolicyFile, "policy-file", "", "read the policy from this file (JSON or HCL) instead of Consul KV (no live reload)")
	fs.StringVar(&c.APIKeysFile, "api-keys-file", "", "enable API keys from this JSON file of sha256 digests (reloaded on SIGHUP)")
	fs.StringVar(&c.ResponseIDKeyFile, "response-id-key-file", "", "key (≥32 bytes) authenticating Responses API ids; the same on every router replica (default: random per process)")
	fs.BoolVar(&c.APIKeysKV, "api-keys-kv", false, "enable API keys from Consul KV <prefix>/keys (watched)")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", app.DefaultMaxBodyBytes, "largest request body accepted (413 above)")
	fs.DurationVar(&c.BodyReadTimeout, "body-read-timeout", app.DefaultBodyReadTimeout, "time a client has to send its request body once its headers arrived (408 after)")
	fs.IntVar(&c.MaxLoadedAdapters, "max-loaded-adapters", gateway.DefaultMaxLoadedAdapters, "LoRA adapters the router loads on demand on one engine (oasis_lora_loadable) at most; the least recently used unused one is unloaded to make room")
	fs.IntVar(&c.EjectAfter, "eject-after", gateway.DefaultEjectAfter, "connection failures in a row that take a worker out of routing for -eject-for (0: never)")
	fs.DurationVar(&c.EjectFor, "eject-for", gateway.DefaultEjectFor, "how long an ejected worker is left out of routing before one request probes it")
	fs.IntVar(&c.MaxHeaderBytes, "max-header-bytes", app.DefaultMaxHeaderBytes, "largest request header block accepted (431 above)")
	fs.IntVar(&c.MaxConnections, "max-connections", app.DefaultMaxConnections, "most client connections served at once: at the cap the connection idle longest is closed, and with none idle more wait in the kernel's accept queue (0: no limit)")
	fs.IntVar(&c.MaxConnectionsPerSource, "max-connections-per-source", app.DefaultMaxConnectionsPerSource, "most client connections from one IPv4 address or IPv6 /64: past it the source's idle connection is closed, else the new one (0: no limit; raise it behind a load balancer)")
	fs.DurationVar(&c.ScrapeInterval, "scrape-interval", time.Second, "how often engine metrics are scraped (0 disables)")
	fs.BoolVar(&c.PowerFromNomad, "power-from-nomad", false, "read GPU power per node from Nomad's node stats (DeviceStats)")
	fs.BoolVar(&c.Register, "register", false, "register this router in Consul as service oasis-router with a check on /health")
	fs.StringVar(&c.Advertise, "advertise", "", "host:port to register (default: the bound -listen address)")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", app.DefaultShutdownTimeout, "how long SIGTERM waits for in-flight streams to finish")
	fs.StringVar(&c.PprofListen, "pprof-listen", "", "serve net/http/pprof on this address (off by default; keep it on loopback)")
	fs.IntVar(&c.KVCachedMaxBlocks, "kvcached-max-blocks", cachestate.DefaultPresenceCapacity, "most blocks tracked from kvcached presence events (each costs one index entry per event-driven engine)")
	fs.IntVar(&c.IndexMaxBlocks, "index-max-blocks", cachestate.DefaultMaxIndexBlocks, "most entries (KV blocks × engines holding them, about 60 bytes each) of each prefix index, all engines together: past it the least recently stored go first")
	fs.IntVar(&c.IndexWorkerMaxBlocks, "index-worker-max-blocks", cachestate.DefaultMaxWorkerBlocks, "most blocks per tier the router models for one engine without KV events, whatever its oasis_kv_capacity advertises (larger ones are cut to it and counted)")
	fs.StringVar(&c.KVCachedService, "kvcached-service", discovery.KVCachedService, "Consul service of the node-local kvcached instances whose presence events count offloaded prefixes as CPU/disk/peer hits (empty: ignore them)")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "serve HTTPS (HTTP/1.1 and HTTP/2 by ALPN, TLS 1.2+) with this PEM certificate chain; reloaded when the file changes")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM private key of -tls-cert; reloaded with it")
	fs.StringVar(&c.TLSClientCA, "tls-client-ca", "", "require client certificates signed by a CA in this PEM bundle (mutual TLS); reloaded when it changes")
	fs.StringVar(&c.FederationListen, "federation-listen", "", "serve other datacenters' routers over HTTP/3 (mutual TLS) on this UDP host:port and route requests to theirs when the policy's federation section enables it (off by default)")
	fs.StringVar(&c.FederationAdvertise, "federation-advertise", "", "host:port registered in Consul as service oasis-router-federation with -register (default: the bound -federation-listen address)")
	fs.StringVar(&c.FederationDC, "federation-dc", "", "this router's datacenter (default: the local Consul agent's)")
	fs.StringVar(&c.FederationTLSCert, "federation-tls-cert", "", "PEM certificate chain of this router on the federation link (client and server); reloaded when the file changes")
	fs.StringVar(&c.FederationTLSKey, "federation-tls-key", "", "PEM private key of -federation-tls-cert")
	fs.StringVar(&c.FederationTLSCA, "federation-tls-ca", "", "PEM bundle of the CAs other routers' federation certificates must chain to")
	fs.StringVar(&c.PeersListen, "peers-listen", "", "share admission and key rate limits with the datacenter's other routers: gossip (memberlist, TCP and UDP) on this host:port; peers are found through their Consul registrations of service oasis-router with meta oasis_peers (written by -register, or the job's service block; off by default)")
	fs.StringVar(&c.PeersAdvertise, "peers-advertise", "", "host:port peers reach -peers-listen at, registered in Consul (default: the bound address)")
	fs.StringVar(&c.PeersKeyFile, "peers-key-file", "", "file with the base64 gossip key (16, 24 or 32 bytes; e.g. rendered from a Nomad variable): gossip is encrypted and unencrypted messages refused; required unless -peers-listen is loopback")
	fs.DurationVar(&c.PeersInterval, "peers-interval", peers.DefaultInterval, "with -peers-listen, the longest time between two of this router's load messages (the heartbeat sent without a change)")
	fs.DurationVar(&c.PeersMinInterval, "peers-min-interval", peers.DefaultMinInterval, "with -peers-listen, the shortest time between two load messages: a router sends its load as soon as its requests on an engine change, changes within this time go out together (at most -peers-interval)")
	fs.StringVar(&c.PeersNode, "peers-node", "", "the Nomad node id this router runs on (the job renders it): the routers' registration with meta oasis_node equal to it is this router's, so that counting the datacenter's routers counts it once")
	fs.StringVar(&c.MeshService, "mesh-service", "", "join the Consul service mesh as this service (e.g. oasis-router): its Connect leaf certificate from the local agent is the router's identity for -mesh-listen, -mesh-engines and the federation link (the token needs service:write on it)")
	fs.StringVar(&c.MeshListen, "mesh-listen", "", "serve the API Connect-native on this TCP host:port: callers present their mesh certificate and intentions decide who may call (needs -mesh-service)")
	fs.BoolVar(&c.MeshEngines, "mesh-engines", false, "reach engines only through the mesh: their sidecar proxies (or Connect-native listeners) from Consul, dialled with the router's mesh certificate, each verified as the engine service (needs -mesh-service)")
	fs.StringVar(hostedUpstreams, "hosted-upstreams", "", "hosted OpenAI-compatible base URLs engines may name in oasis_upstream, comma-separated: https://host[:port]/path, host may start with *. (one label); others are ignored")
	fs.StringVar(&lists.corsOrigins, "cors-origins", "", "let browser pages of these origins call the API (CORS), comma-separated scheme://host[:port], or * for any (off by default)")
	fs.StringVar(&lists.corsMethods, "cors-methods", "", "methods a CORS preflight allows, comma-separated (default GET, POST)")
	fs.StringVar(&lists.corsHeaders, "cors-headers", "", "request headers a CORS preflight allows, comma-separated, or * for those asked (default Authorization, Content-Type, X-Request-Id and the OpenAI SDKs' OpenAI-*, X-Stainless-* headers)")
	fs.StringVar(hostedKeyEnvs, "hosted-key-envs", "", "environment variables engines may name in oasis_upstream_key_env, comma-separated: NAME (any allowed upstream) or NAME=URL pattern (only those upstreams)")
	fs.StringVar(&c.OTLPEndpoint, "otlp-endpoint", "", "export OpenTelemetry traces of API requests over OTLP/HTTP to this URL, e.g. http://127.0.0.1:4318 (off by default; path default /v1/traces); engines get each attempt's traceparent")
	fs.Float64Var(&c.TraceSampleRatio, "trace-sample-ratio", app.DefaultTraceSampleRatio, "share of new traces sampled with -otlp-endpoint, 0 to 1 (1 samples every request); a client's traceparent decides for its own trace")
	fs.StringVar(&rt.logLevel, "log-level", "info", "trace, debug, info, warn, error")
	fs.BoolVar(&rt.logJSON, "log-json", false, "log JSON lines")
	fs.IntVar(&rt.gcPercent, "gc-percent", 400, "Go GC target percentage (runtime/debug.SetGCPercent): the router's live heap is a few MiB, so collecting less often trades a little memory for CPU per request; -1 disables GC except under -memory-limit")
	fs.IntVar(&rt.gomaxprocs, "gomaxprocs", 0, "threads running Go code at once (runtime.GOMAXPROCS); 0 sizes them to the router's CPU use, from 1 up to the CPUs available (as does a GOMAXPROCS environment variable, which is then the most used); N > 0 fixes them at N")
	fs.Int64Var(&rt.memoryLimit, "memory-limit", 0, "soft memory limit in bytes for the Go runtime (runtime/debug.SetMemoryLimit); 0 leaves the runtime's default")
	return fs
}
