// Command oasis-kvcached is the per-node tiered KV block store: RAM, then SSD,
// then other nodes over QUIC, served over the Redis protocol so LMCache's
// redis:// backend and Redis tools talk to it unchanged. kvcached is
// assembled by kvcached/app; this command parses its flags into an
// app.Config and runs it until SIGINT or SIGTERM.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/agentconfig"
	"github.com/oasis-llm/oasis/kvcached/app"
	"github.com/oasis-llm/oasis/kvcached/peer"
	"github.com/oasis-llm/oasis/kvcached/server"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "oasis-kvcached:", err)
		os.Exit(1)
	}
}

// run parses args, builds the app and serves until ctx ends; SIGHUP
// reloads --password-file.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	cfg, logLevel, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// Caught from the start: SIGHUP's default action would end the process,
	// and Nomad may send it as soon as it renders the password file.
	var hup chan os.Signal
	if cfg.PasswordFile != "" {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	cfg.Logger = hclog.New(&hclog.LoggerOptions{Name: "oasis-kvcached", Level: hclog.LevelFromString(logLevel), Output: stderr})
	cfg.TuneRuntime = true
	a, err := app.New(cfg)
	if err != nil {
		return err
	}
	if hup != nil {
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					_ = a.ReloadPassword() // logged by the app
				}
			}
		}()
	}
	return a.Run(ctx)
}

// parseFlags fills an app.Config from the command line, the config files
// its --config flags name (HCL or JSON; flags win; kvcached/README.md
// "Configuration") and the environment, and validates it; the second result
// is --log-level.
func parseFlags(args []string, stderr io.Writer) (app.Config, string, error) {
	var cfg app.Config
	fs := flag.NewFlagSet("oasis-kvcached", flag.ContinueOnError)
	fs.SetOutput(stderr)
	logLevel := fs.String("log-level", "info", "trace, debug, info, warn or error")
	lists := defineFlags(fs, &cfg)
	var configs agentconfig.Paths
	fs.Var(&configs, "config", agentconfig.Usage)
	if err := fs.Parse(args); err != nil {
		return app.Config{}, "", err
	}
	// The files' keys set the flags the command line left alone.
	if err := agentconfig.Apply(fs, app.ConfigKeys, configs); err != nil {
		return app.Config{}, "", err
	}
	cfg.Peers, cfg.PeerDatacenters = splitList(lists.peers), splitList(lists.peerDCs)
	cfg.Password = os.Getenv("OASIS_KVCACHED_PASSWORD")
	if cfg.ConsulAddr == "" {
		cfg.ConsulAddr = os.Getenv("CONSUL_HTTP_ADDR")
	}
	if err := cfg.Validate(); err != nil {
		return app.Config{}, "", err
	}
	return cfg, *logLevel, nil
}

// listFlags are the comma-separated flags, split after parsing.
type listFlags struct{ peers, peerDCs string }

// defineFlags defines every flag that sets a Config field, with its
// default, in one place (a config file is layered in here).
func defineFlags(fs *flag.FlagSet, c *app.Config) *listFlags {
	l := &listFlags{}
	c.RAMBytes, c.MaxValueBytes, c.PeerWANBytesPerSecond = app.DefaultRAMBytes, app.DefaultMaxValueBytes, app.DefaultPeerWANBytesPerSecond
	fs.StringVar(&c.Addr, "addr", app.DefaultAddr, "Redis-protocol listen address (loopback by default)")
	fs.StringVar(&c.HTTPAddr, "http-addr", app.DefaultHTTPAddr, "HTTP listen address for /metrics and /health (empty disables)")
	fs.Var((*byteFlag)(&c.RAMBytes), "ram-bytes", "memory budget (e.g. 8GiB): the RAM tier gets what in-flight values and GC headroom leave; RSS stays within it + 10%")
	fs.Var((*byteFlag)(&c.DiskBytes), "disk-bytes", "SSD tier size (0 disables the disk tier)")
	fs.Var((*byteFlag)(&c.MaxValueBytes), "max-value-bytes", "largest value accepted (proto-max-bulk-len)")
	fs.StringVar(&c.DataDir, "data-dir", "", "directory of the SSD tier (block files and Pebble index)")
	fs.StringVar(&c.PasswordFile, "password-file", "", "file holding the Redis password, read again on SIGHUP (or set OASIS_KVCACHED_PASSWORD); none by default")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", server.DefaultIdleTimeout, "close Redis connections that send no command for this long (0 disables)")
	fs.DurationVar(&c.AuthTimeout, "auth-timeout", server.DefaultAuthTimeout, "with a password, close connections that have not authenticated this long after connecting (0 disables)")
	fs.StringVar(&c.QUICAddr, "quic-addr", "", "UDP address serving peers over QUIC (empty disables peers)")
	fs.StringVar(&c.QUICAdvertise, "quic-advertise", "", "host:port peers reach this node on, to skip itself in the Consul catalog (default: --quic-addr, or every local address with its port when that is a wildcard)")
	fs.StringVar(&c.TLSCA, "tls-ca", "", "PEM CA that signs every kvcached certificate")
	fs.StringVar(&c.TLSCert, "tls-cert", "", "PEM certificate of this node (server and client auth)")
	fs.StringVar(&c.TLSKey, "tls-key", "", "PEM key of this node")
	fs.StringVar(&c.TLSServerName, "tls-server-name", peer.DefaultServerName, "DNS name verified on peers' certificates")
	fs.BoolVar(&c.TLSVerifyAddress, "tls-verify-address", false, "verify that each peer's certificate names the address (IP or DNS SAN) it is dialled at instead of --tls-server-name, so a node cannot pose as another (needs a certificate per node)")
	fs.BoolVar(&c.Mesh, "mesh", false, "take the peer identity from Consul Connect as service --consul-service instead of --tls-* files: peers must be that service, and callers are let in by Consul intentions, checked again on every request (needs a Consul address)")
	fs.StringVar(&l.peers, "peers", "", "comma-separated static peer QUIC addresses (host:port)")
	fs.StringVar(&c.ConsulAddr, "consul-addr", "", "Consul HTTP address to discover peers from (default $CONSUL_HTTP_ADDR; empty: no discovery)")
	fs.StringVar(&c.ConsulService, "consul-service", app.DefaultConsulService, "Consul service name of kvcached instances")
	fs.StringVar(&c.EventsEndpoint, "kv-events-endpoint", "", "ZMQ PUB endpoint for block presence events, e.g. tcp://127.0.0.1:5570 (empty disables)")
	fs.StringVar(&c.EventsReplayEndpoint, "kv-events-replay-endpoint", "", "ZMQ ROUTER endpoint replaying recent presence events")
	fs.IntVar(&c.EventsBlockSize, "kv-events-block-size", app.DefaultEventsBlockSize, "tokens per announced block (LMCache chunk_size)")
	fs.DurationVar(&c.PeerTimeout, "peer-timeout", app.DefaultPeerTimeout, "timeout of one peer fetch")
	fs.DurationVar(&c.PeerFilterInterval, "peer-filter-interval", app.DefaultPeerFilterInterval, "how often peers exchange membership filters")
	fs.StringVar(&l.peerDCs, "peer-datacenters", "", "comma-separated remote Consul datacenters whose oasis-kvcached instances are peers too, asked after local peers miss (empty: none; see kvcached/README.md for why this is off by default)")
	fs.DurationVar(&c.PeerWANTimeout, "peer-wan-timeout", app.DefaultPeerWANTimeout, "timeout of one fetch from a peer in a remote datacenter")
	fs.Var((*byteFlag)(&c.PeerWANBytesPerSecond), "peer-wan-bytes-per-second", "block bytes this node may pull from each remote datacenter per second (token bucket, one second of burst); a fetch over it is skipped as a miss (0: no cap)")
	fs.DurationVar(&c.PeerWANDiscoveryTimeout, "peer-wan-discovery-timeout", peer.DefaultWANQueryTimeout, "timeout of each Consul query about a remote datacenter; one that fails marks that datacenter's discovery stale")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve Go's /debug/pprof on the HTTP address (for profiling)")
	return l
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// byteFlag parses sizes like 512MiB, 8GiB, 1G, 1048576.
type byteFlag int64

func (b *byteFlag) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteFlag) Set(s string) error {
	v, err := agentconfig.ParseBytes(s)
	if err != nil {
		return err
	}
	*b = byteFlag(v)
	return nil
}
