package app

import (
	"fmt"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/kvcached/peer"
)

// Defaults of the fields whose zero value means "the default", and of the
// flags whose zero value means "off" (the flags default to them).
const (
	DefaultAddr                  = "127.0.0.1:6380"
	DefaultHTTPAddr              = "127.0.0.1:9380"
	DefaultRAMBytes              = 1 << 30
	DefaultMaxValueBytes         = 64 << 20
	DefaultConsulService         = "oasis-kvcached"
	DefaultEventsBlockSize       = 256
	DefaultPeerTimeout           = 2 * time.Second
	DefaultPeerFilterInterval    = 2 * time.Second
	DefaultPeerWANTimeout        = 5 * time.Second
	DefaultPeerWANBytesPerSecond = 100 << 20

	// shutdownFlushTimeout bounds the flush of the RAM tier's blocks to
	// disk when Run ends.
	shutdownFlushTimeout = 10 * time.Second
	// meshStartTimeout bounds the wait for the Connect leaf: a Consul
	// without Connect, or a token without service:write, must fail the
	// start rather than hang it.
	meshStartTimeout = 30 * time.Second
)

// Config is everything kvcached's flags set. Each field's comment names its
// flag; errors from New name the flag too. Zero values mean the flag's
// default unless the comment says otherwise.
type Config struct {
	Addr     string // --addr (default DefaultAddr)
	HTTPAddr string // --http-addr: /metrics and /health; empty: none
	Pprof    bool   // --pprof: Go's /debug/pprof on HTTPAddr

	RAMBytes      int64  // --ram-bytes: the memory budget (default DefaultRAMBytes)
	DiskBytes     int64  // --disk-bytes: the SSD tier; 0: none
	DataDir       string // --data-dir: needed with DiskBytes
	MaxValueBytes int64  // --max-value-bytes (default DefaultMaxValueBytes)

	// Password is the Redis password ($OASIS_KVCACHED_PASSWORD); empty:
	// none. PasswordFile (--password-file), when set, replaces it and is
	// read again by App.ReloadPassword.
	Password     string
	PasswordFile string
	IdleTimeout  time.Duration // --idle-timeout; 0: none
	AuthTimeout  time.Duration // --auth-timeout; 0: none

	QUICAddr         string   // --quic-addr: serve peers; empty: no peers
	QUICAdvertise    string   // --quic-advertise
	TLSCA            string   // --tls-ca
	TLSCert          string   // --tls-cert
	TLSKey           string   // --tls-key
	TLSServerName    string   // --tls-server-name (default peer.DefaultServerName)
	TLSVerifyAddress bool     // --tls-verify-address
	Mesh             bool     // --mesh: the peer identity from Consul Connect
	Peers            []string // --peers: static peer QUIC addresses
	ConsulAddr       string   // --consul-addr: discover peers; empty: no Consul
	ConsulService    string   // --consul-service (default DefaultConsulService)

	PeerTimeout             time.Duration // --peer-timeout (default DefaultPeerTimeout)
	PeerFilterInterval      time.Duration // --peer-filter-interval (default DefaultPeerFilterInterval)
	PeerDatacenters         []string      // --peer-datacenters
	PeerWANTimeout          time.Duration // --peer-wan-timeout (default DefaultPeerWANTimeout)
	PeerWANDiscoveryTimeout time.Duration // --peer-wan-discovery-timeout (default peer.DefaultWANQueryTimeout)
	PeerWANBytesPerSecond   int64         // --peer-wan-bytes-per-second; 0: no cap

	EventsEndpoint       string // --kv-events-endpoint: presence events; empty: none
	EventsReplayEndpoint string // --kv-events-replay-endpoint
	EventsBlockSize      int    // --kv-events-block-size (default DefaultEventsBlockSize)

	// TuneRuntime sets the Go memory limit from RAMBytes and, unless GOGC
	// is set, follows the live heap with the GC percent while Run runs.
	// Both are process-wide: the command sets it, tests leave it off.
	TuneRuntime bool

	// Logger defaults to a null logger; Registry to a new registry with the
	// Go and process collectors (served on /metrics).
	Logger   hclog.Logger
	Registry *prometheus.Registry
}

// ConfigError is an invalid Config field; Flag names the flag that sets it.
// Its message reads "<flag> <problem>".
type ConfigError struct {
	Flag string
	Err  error
}

func (e *ConfigError) Error() string { return e.Flag + " " + e.Err.Error() }
func (e *ConfigError) Unwrap() error { return e.Err }

func flagErr(flag, format string, args ...any) error {
	return &ConfigError{Flag: flag, Err: fmt.Errorf(format, args...)}
}

func (c Config) withDefaults() Config {
	if c.Addr == "" {
		c.Addr = DefaultAddr
	}
	if c.RAMBytes == 0 {
		c.RAMBytes = DefaultRAMBytes
	}
	if c.MaxValueBytes == 0 {
		c.MaxValueBytes = DefaultMaxValueBytes
	}
	if c.TLSServerName == "" {
		c.TLSServerName = peer.DefaultServerName
	}
	if c.ConsulService == "" {
		c.ConsulService = DefaultConsulService
	}
	if c.PeerTimeout == 0 {
		c.PeerTimeout = DefaultPeerTimeout
	}
	if c.PeerFilterInterval == 0 {
		c.PeerFilterInterval = DefaultPeerFilterInterval
	}
	if c.PeerWANTimeout == 0 {
		c.PeerWANTimeout = DefaultPeerWANTimeout
	}
	if c.PeerWANDiscoveryTimeout == 0 {
		c.PeerWANDiscoveryTimeout = peer.DefaultWANQueryTimeout
	}
	if c.EventsBlockSize == 0 {
		c.EventsBlockSize = DefaultEventsBlockSize
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	return c
}

// Validate checks the combinations of fields (what New checks before
// building anything); the error is a *ConfigError.
func (c Config) Validate() error {
	switch {
	case c.RAMBytes < 0 || c.DiskBytes < 0 || c.MaxValueBytes < 0 || c.PeerWANBytesPerSecond < 0:
		return flagErr("--ram-bytes", "and the other sizes must not be negative")
	case c.DiskBytes > 0 && c.DataDir == "":
		return flagErr("--disk-bytes", "needs --data-dir")
	case c.Mesh && (c.QUICAddr == "" || c.ConsulAddr == ""):
		return flagErr("--mesh", "needs --quic-addr and a Consul address (--consul-addr or CONSUL_HTTP_ADDR)")
	case c.Mesh && (c.TLSCA != "" || c.TLSCert != "" || c.TLSKey != "" || c.TLSVerifyAddress):
		return flagErr("--mesh", "takes the identity from Consul Connect: drop --tls-ca, --tls-cert, --tls-key and --tls-verify-address")
	case len(c.PeerDatacenters) > 0 && (c.QUICAddr == "" || c.ConsulAddr == ""):
		return flagErr("--peer-datacenters", "needs --quic-addr and a Consul address (--consul-addr or CONSUL_HTTP_ADDR)")
	}
	return nil
}
