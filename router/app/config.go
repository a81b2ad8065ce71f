package app

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/peers"
)

// Discovery sources of engines.
const (
	DiscoveryConsul = "consul" // Consul's health API
	DiscoveryNomad  = "nomad"  // Nomad's native service discovery
	DiscoveryStatic = "static" // Config.Engines
)

// Defaults of the fields whose zero value means "the default".
const (
	DefaultListen          = "127.0.0.1:8080"
	DefaultKVPrefix        = "oasis/router"
	DefaultMaxBodyBytes    = 16 << 20
	DefaultBodyReadTimeout = 30 * time.Second
	DefaultMaxHeaderBytes  = 1 << 20
	DefaultShutdownTimeout = 60 * time.Second
	DefaultMaxConnections  = 4096
	// DefaultMaxConnectionsPerSource is a quarter of the cap: one address
	// cannot take every slot. Behind a load balancer or NAT that shows
	// every client as one address, raise it or set 0.
	DefaultMaxConnectionsPerSource = 1024

	readHeaderTimeout = 10 * time.Second
	idleTimeout       = 120 * time.Second
)

// Config is everything the router's flags set. Each field's comment names
// its flag; errors from New name the flag too. Zero values mean the flag's
// default unless the comment says otherwise.
type Config struct {
	Listen     string // -listen (default DefaultListen)
	Discovery  string // -discovery: DiscoveryConsul (default), DiscoveryNomad or DiscoveryStatic
	ConsulAddr string // -consul-addr (default $CONSUL_HTTP_ADDR or Consul's default)
	NomadAddr  string // -nomad-addr (default $NOMAD_ADDR)
	Service    string // -service (default discovery.EngineService)
	ServiceTag string // -service-tag
	KVPrefix   string // -kv-prefix (default DefaultKVPrefix)
	// Engines are the engines of DiscoveryStatic (-engines, ParseEngines).
	Engines []StaticEngine

	PolicyFile  string // -policy-file: a fixed policy instead of Consul KV
	APIKeysFile string // -api-keys-file (reloaded by App.ReloadAPIKeys)
	APIKeysKV   bool   // -api-keys-kv
	// ResponseIDKeyFile holds the key (at least gateway.MinResponseIDKey
	// bytes, surrounding white space trimmed) that authenticates Responses
	// API ids; every replica of a datacenter reads the same one. Empty: a
	// random key per process (gateway.Config.ResponseIDKey).
	ResponseIDKeyFile string // -response-id-key-file

	MaxBodyBytes    int64         // -max-body-bytes (default DefaultMaxBodyBytes)
	BodyReadTimeout time.Duration // -body-read-timeout (default DefaultBodyReadTimeout)
	// EjectAfter connection failures in a row leave a worker out of
	// routing for EjectFor (-eject-after, flag default
	// gateway.DefaultEjectAfter; -eject-for, default gateway.DefaultEjectFor
	// when zero). EjectAfter 0 means never, as the flag's 0 does (negative
	// too).
	EjectAfter int
	EjectFor   time.Duration
	// MaxLoadedAdapters bounds the LoRA adapters the router loads on one
	// engine on demand (-max-loaded-adapters; 0: gateway.DefaultMaxLoadedAdapters).
	MaxLoadedAdapters int
	MaxHeaderBytes    int // -max-header-bytes (default DefaultMaxHeaderBytes)
	// MaxConnections caps concurrent client connections (-max-connections;
	// 0: unlimited); idle ones are closed to make room (connlimit.go).
	MaxConnections int
	// MaxConnectionsPerSource caps one source's connections (an IPv4
	// address, an IPv6 /64; -max-connections-per-source, flag default
	// DefaultMaxConnectionsPerSource; 0: unlimited).
	MaxConnectionsPerSource int

	ScrapeInterval time.Duration // -scrape-interval (0: no engine metrics scraping)
	PowerFromNomad bool          // -power-from-nomad

	Register        bool          // -register
	Advertise       string        // -advertise (default: the bound address)
	ShutdownTimeout time.Duration // -shutdown-timeout (default DefaultShutdownTimeout)
	PprofListen     string        // -pprof-listen (empty: off)

	KVCachedService   string // -kvcached-service (empty: kvcached presence events ignored)
	KVCachedMaxBlocks int    // -kvcached-max-blocks (default cachestate.DefaultPresenceCapacity)
	// IndexMaxBlocks bounds each prefix index's entries, all engines together
	// (-index-max-blocks, default cachestate.DefaultMaxIndexBlocks);
	// IndexWorkerMaxBlocks each tier of an event-less engine's modelled cache,
	// whatever its oasis_kv_capacity says (-index-worker-max-blocks, default
	// cachestate.DefaultMaxWorkerBlocks).
	IndexMaxBlocks       int
	IndexWorkerMaxBlocks int

	// AdaptiveGOMAXPROCS sizes GOMAXPROCS to the router's CPU use while it
	// runs (-gomaxprocs=0). It changes process-wide state: off in tests.
	AdaptiveGOMAXPROCS bool

	TLSCert     string // -tls-cert: PEM certificate chain; serves HTTPS (HTTP/1.1 and HTTP/2)
	TLSKey      string // -tls-key: its PEM key
	TLSClientCA string // -tls-client-ca: PEM CA bundle client certificates must chain to (mutual TLS)

	// Federation with other datacenters' routers (router/federation); off
	// without FederationListen.
	FederationListen    string // -federation-listen: UDP host:port of the HTTP/3 listener peers forward to
	FederationAdvertise string // -federation-advertise: host:port registered for peers (default: the bound address)
	FederationDC        string // -federation-dc (default: the local Consul agent's datacenter)
	FederationTLSCert   string // -federation-tls-cert: PEM certificate chain peers see and are shown
	FederationTLSKey    string // -federation-tls-key
	FederationTLSCA     string // -federation-tls-ca: PEM bundle peers' certificates must chain to

	// The datacenter's other routers (router/peers): admission's
	// max_in_flight and the keys' rate limits split with them; off
	// without PeersListen.
	PeersListen    string // -peers-listen: TCP and UDP host:port of the gossip listener
	PeersAdvertise string // -peers-advertise: host:port registered for peers (default: the bound address)
	PeersKeyFile   string // -peers-key-file: base64 gossip key, 16, 24 or 32 bytes (required off loopback)
	// -peers-interval and -peers-min-interval: the longest and shortest
	// time between two of this router's load messages (peers.Schedule;
	// zero: peers.DefaultInterval, peers.DefaultMinInterval).
	PeersInterval    time.Duration
	PeersMinInterval time.Duration
	// PeersNode (-peers-node) is the Nomad node id this router runs on:
	// a registration with meta oasis_node equal to it is this router's
	// (the job renders it; router/peers Config.Node).
	PeersNode string

	// The Consul service mesh (Connect): MeshService is the router's
	// identity, from the local agent's leaf certificate for that service.
	MeshService string // -mesh-service (empty: not in the mesh)
	MeshListen  string // -mesh-listen: TCP host:port served Connect-native (callers' intentions decide)
	MeshEngines bool   // -mesh-engines: reach engines only through the mesh (their sidecars or Connect-native listeners)

	HostedUpstreams []string // -hosted-upstreams: allowed oasis_upstream base URLs (discovery.ParseHostedPolicy)
	HostedKeyEnvs   []string // -hosted-key-envs: allowed oasis_upstream_key_env names

	// CORS (router/gateway/cors.go), off unless CORSOrigins is set.
	CORSOrigins []string // -cors-origins: origins browser pages may call from, or *
	CORSMethods []string // -cors-methods (default gateway.DefaultCORSMethods)
	CORSHeaders []string // -cors-headers (default gateway.DefaultCORSHeaders), or *

	// OpenTelemetry traces (router/gateway/tracing.go), off by default.
	OTLPEndpoint string // -otlp-endpoint: OTLP/HTTP receiver URL, e.g. http://127.0.0.1:4318 (path default /v1/traces)
	// TraceSampleRatio is the share of new traces sampled, 0 to 1
	// (-trace-sample-ratio, flag default DefaultTraceSampleRatio; 0: only
	// requests whose traceparent says sampled). A client's traceparent
	// decides for its trace.
	TraceSampleRatio float64
	// TracerProvider, when set, is used instead of -otlp-endpoint's
	// exporter; its owner shuts it down.
	TracerProvider trace.TracerProvider

	Logger hclog.Logger // nil: no logs
	// Registry gets the router's metrics and is served at /metrics; nil: a
	// new one with the Go runtime and process collectors.
	Registry *prometheus.Registry
}

// StaticEngine is one engine of -engines.
type StaticEngine struct {
	Model   string
	Address string // host:port
	Engine  string // oasis_engine, e.g. "sim" (optional)
}

// ConfigError is an invalid Config field; Flag names the flag that sets it.
type ConfigError struct {
	Flag string
	Err  error
}

func (e *ConfigError) Error() string { return e.Flag + ": " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

func flagErr(flag, format string, args ...any) error {
	return &ConfigError{Flag: flag, Err: fmt.Errorf(format, args...)}
}

// ParseEngines parses -engines: model=host:port[@engine], comma-separated.
func ParseEngines(s string) ([]StaticEngine, error) {
	var out []StaticEngine
	for i, e := range strings.Split(s, ",") {
		e = strings.TrimSpace(e)
		if e == "" {
			continue
		}
		model, addr, ok := strings.Cut(e, "=")
		if !ok || model == "" {
			return nil, flagErr("-engines", "entry %d %q: want model=host:port[@engine]", i, e)
		}
		addr, engine, hasEngine := strings.Cut(addr, "@")
		if hasEngine && engine == "" {
			return nil, flagErr("-engines", "entry %d %q: empty engine after @", i, e)
		}
		if err := checkHostPort(addr); err != nil {
			return nil, flagErr("-engines", "entry %d %q: %w", i, e, err)
		}
		out = append(out, StaticEngine{Model: model, Address: addr, Engine: engine})
	}
	return out, nil
}

// instances are the static engines as discovery instances.
func instances(engines []StaticEngine) []discovery.Instance {
	out := make([]discovery.Instance, len(engines))
	for i, e := range engines {
		meta := map[string]string{discovery.MetaModel: e.Model}
		if e.Engine != "" {
			meta[discovery.MetaEngine] = e.Engine
		}
		out[i] = discovery.Instance{ID: fmt.Sprintf("static-%d-%s", i, e.Address), Address: e.Address, Meta: meta}
	}
	return out
}

func checkHostPort(addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	if port == "" {
		return errors.New("missing port")
	}
	return nil
}

// withDefaults fills the zero fields that have a default.
func (c Config) withDefaults() Config {
	def := func(s *string, v string) {
		if *s == "" {
			*s = v
		}
	}
	def(&c.Listen, DefaultListen)
	def(&c.Discovery, DiscoveryConsul)
	def(&c.Service, discovery.EngineService)
	def(&c.KVPrefix, DefaultKVPrefix)
	c.KVPrefix = strings.TrimSuffix(c.KVPrefix, "/")
	if c.EjectAfter <= 0 {
		c.EjectAfter = -1 // never: the gateway's 0 is its default
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if c.BodyReadTimeout == 0 {
		c.BodyReadTimeout = DefaultBodyReadTimeout
	}
	if c.MaxHeaderBytes == 0 {
		c.MaxHeaderBytes = DefaultMaxHeaderBytes
	}
	if c.ShutdownTimeout == 0 {
		c.ShutdownTimeout = DefaultShutdownTimeout
	}
	if c.KVCachedMaxBlocks == 0 {
		c.KVCachedMaxBlocks = cachestate.DefaultPresenceCapacity
	}
	if c.IndexMaxBlocks == 0 {
		c.IndexMaxBlocks = cachestate.DefaultMaxIndexBlocks
	}
	if c.IndexWorkerMaxBlocks == 0 {
		c.IndexWorkerMaxBlocks = cachestate.DefaultMaxWorkerBlocks
	}
	if c.PeersInterval == 0 {
		c.PeersInterval = peers.DefaultInterval
	}
	if c.PeersMinInterval == 0 {
		c.PeersMinInterval = min(peers.DefaultMinInterval, c.PeersInterval)
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return c
}

// validate checks what can be checked without touching files or the network.
func (c Config) validate() error {
	if c.Listen != ListenOff {
		if err := checkHostPort(c.Listen); err != nil {
			return flagErr("-listen", "%w", err)
		}
	} else if c.Register {
		return flagErr("-register", "registers the -listen address: not with -listen off (let Nomad register the mesh service)")
	}
	if err := c.validateMesh(); err != nil {
		return err
	}
	switch c.Discovery {
	case DiscoveryConsul, DiscoveryNomad:
		if len(c.Engines) > 0 {
			return flagErr("-engines", "only used with -discovery=static")
		}
	case DiscoveryStatic:
		if len(c.Engines) == 0 {
			return flagErr("-engines", "-discovery=static needs at least one engine")
		}
	default:
		return flagErr("-discovery", "want consul, nomad or static, got %q", c.Discovery)
	}
	for i, e := range c.Engines {
		if e.Model == "" {
			return flagErr("-engines", "engine %d has no model", i)
		}
		if err := checkHostPort(e.Address); err != nil {
			return flagErr("-engines", "engine %d: %w", i, err)
		}
	}
	if c.APIKeysFile != "" && c.APIKeysKV {
		return flagErr("-api-keys-kv", "-api-keys-file and -api-keys-kv are exclusive")
	}
	if c.MaxLoadedAdapters < 0 {
		return flagErr("-max-loaded-adapters", "must be ≥ 0, got %d", c.MaxLoadedAdapters)
	}
	for _, n := range []struct {
		flag string
		v    int64
	}{
		{"-max-body-bytes", c.MaxBodyBytes}, {"-body-read-timeout", int64(c.BodyReadTimeout)},
		{"-max-header-bytes", int64(c.MaxHeaderBytes)}, {"-max-connections", int64(c.MaxConnections)},
		{"-max-connections-per-source", int64(c.MaxConnectionsPerSource)},
		{"-scrape-interval", int64(c.ScrapeInterval)}, {"-shutdown-timeout", int64(c.ShutdownTimeout)},
		{"-kvcached-max-blocks", int64(c.KVCachedMaxBlocks)}, {"-eject-for", int64(c.EjectFor)},
		{"-index-max-blocks", int64(c.IndexMaxBlocks)}, {"-index-worker-max-blocks", int64(c.IndexWorkerMaxBlocks)},
	} {
		if n.v < 0 {
			return flagErr(n.flag, "must not be negative")
		}
	}
	for _, a := range []struct{ flag, v string }{{"-advertise", c.Advertise}, {"-pprof-listen", c.PprofListen}} {
		if a.v == "" {
			continue
		}
		if err := checkHostPort(a.v); err != nil {
			return flagErr(a.flag, "%w", err)
		}
	}
	if err := c.validateTLS(); err != nil {
		return err
	}
	if err := c.validateTracing(); err != nil {
		return err
	}
	if err := c.validatePeers(); err != nil {
		return err
	}
	return c.validateFederation()
}

func (c Config) validateTLS() error {
	switch {
	case c.TLSCert != "" && c.TLSKey == "":
		return flagErr("-tls-key", "required with -tls-cert")
	case c.TLSKey != "" && c.TLSCert == "":
		return flagErr("-tls-cert", "required with -tls-key")
	case c.TLSClientCA != "" && c.TLSCert == "":
		return flagErr("-tls-cert", "required with -tls-client-ca (mutual TLS needs a server certificate)")
	}
	return nil
}

// tlsFlag names the flag that sets a tlsfiles.Config field.
func tlsFlag(field string) string {
	switch field {
	case "CertFile":
		return "-tls-cert"
	case "KeyFile":
		return "-tls-key"
	case "ClientCAFile":
		return "-tls-client-ca"
	}
	return "-tls-cert"
}
