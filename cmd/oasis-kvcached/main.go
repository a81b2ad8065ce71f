// Command oasis-kvcached is the per-node tiered KV block store: RAM, then SSD,
// then other nodes over QUIC, served over the Redis protocol so LMCache's
// redis:// backend and Redis tools talk to it unchanged.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/kvcached/peer"
	"github.com/oasis-llm/oasis/kvcached/presence"
	"github.com/oasis-llm/oasis/kvcached/resp"
	"github.com/oasis-llm/oasis/kvcached/server"
	"github.com/oasis-llm/oasis/kvcached/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "oasis-kvcached:", err)
		os.Exit(1)
	}
}

type options struct {
	addr, httpAddr, dataDir          string
	ramBytes, diskBytes, maxValue    int64
	passwordFile                     string
	quicAddr, tlsCA, tlsCert, tlsKey string
	tlsServerName                    string
	tlsVerifyAddress                 bool
	mesh                             bool
	peers                            string
	consulAddr, consulService        string
	quicAdvertise                    string
	eventsEndpoint, eventsReplay     string
	blockSize                        int
	fetchTimeout, filterInterval     time.Duration
	peerDCs                          string
	wanTimeout, wanDiscoveryTimeout  time.Duration
	wanBytesPerSecond                int64
	idleTimeout, authTimeout         time.Duration
	logLevel                         string
	pprof                            bool
}

func parseFlags(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("oasis-kvcached", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ram, disk, maxv, wanRate := byteFlag(1<<30), byteFlag(0), byteFlag(64<<20), byteFlag(100<<20)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:6380", "Redis-protocol listen address (loopback by default)")
	fs.StringVar(&o.httpAddr, "http-addr", "127.0.0.1:9380", "HTTP listen address for /metrics and /health (empty disables)")
	fs.Var(&ram, "ram-bytes", "memory budget (e.g. 8GiB): the RAM tier gets what in-flight values and GC headroom leave; RSS stays within it + 10%")
	fs.Var(&disk, "disk-bytes", "SSD tier size (0 disables the disk tier)")
	fs.Var(&maxv, "max-value-bytes", "largest value accepted (proto-max-bulk-len)")
	fs.StringVar(&o.dataDir, "data-dir", "", "directory of the SSD tier (block files and Pebble index)")
	fs.StringVar(&o.passwordFile, "password-file", "", "file holding the Redis password, read again on SIGHUP (or set OASIS_KVCACHED_PASSWORD); none by default")
	fs.DurationVar(&o.idleTimeout, "idle-timeout", server.DefaultIdleTimeout, "close Redis connections that send no command for this long (0 disables)")
	fs.DurationVar(&o.authTimeout, "auth-timeout", server.DefaultAuthTimeout, "with a password, close connections that have not authenticated this long after connecting (0 disables)")
	fs.StringVar(&o.quicAddr, "quic-addr", "", "UDP address serving peers over QUIC (empty disables peers)")
	fs.StringVar(&o.quicAdvertise, "quic-advertise", "", "host:port peers reach this node on, to skip itself in the Consul catalog (default: --quic-addr, or every local address with its port when that is a wildcard)")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "PEM CA that signs every kvcached certificate")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "PEM certificate of this node (server and client auth)")
	fs.StringVar(&o.tlsKey, "tls-key", "", "PEM key of this node")
	fs.StringVar(&o.tlsServerName, "tls-server-name", peer.DefaultServerName, "DNS name verified on peers' certificates")
	fs.BoolVar(&o.tlsVerifyAddress, "tls-verify-address", false, "verify that each peer's certificate names the address (IP or DNS SAN) it is dialled at instead of --tls-server-name, so a node cannot pose as another (needs a certificate per node)")
	fs.BoolVar(&o.mesh, "mesh", false, "take the peer identity from Consul Connect as service --consul-service instead of --tls-* files: peers must be that service, and callers are let in by Consul intentions, checked again on every request (needs a Consul address)")
	fs.StringVar(&o.peers, "peers", "", "comma-separated static peer QUIC addresses (host:port)")
	fs.StringVar(&o.consulAddr, "consul-addr", "", "Consul HTTP address to discover peers from (default $CONSUL_HTTP_ADDR; empty: no discovery)")
	fs.StringVar(&o.consulService, "consul-service", "oasis-kvcached", "Consul service name of kvcached instances")
	fs.StringVar(&o.eventsEndpoint, "kv-events-endpoint", "", "ZMQ PUB endpoint for block presence events, e.g. tcp://127.0.0.1:5570 (empty disables)")
	fs.StringVar(&o.eventsReplay, "kv-events-replay-endpoint", "", "ZMQ ROUTER endpoint replaying recent presence events")
	fs.IntVar(&o.blockSize, "kv-events-block-size", 256, "tokens per announced block (LMCache chunk_size)")
	fs.DurationVar(&o.fetchTimeout, "peer-timeout", 2*time.Second, "timeout of one peer fetch")
	fs.DurationVar(&o.filterInterval, "peer-filter-interval", 2*time.Second, "how often peers exchange membership filters")
	fs.StringVar(&o.peerDCs, "peer-datacenters", "", "comma-separated remote Consul datacenters whose oasis-kvcached instances are peers too, asked after local peers miss (empty: none; see kvcached/README.md for why this is off by default)")
	fs.DurationVar(&o.wanTimeout, "peer-wan-timeout", 5*time.Second, "timeout of one fetch from a peer in a remote datacenter")
	fs.Var(&wanRate, "peer-wan-bytes-per-second", "block bytes this node may pull from each remote datacenter per second (token bucket, one second of burst); a fetch over it is skipped as a miss (0: no cap)")
	fs.DurationVar(&o.wanDiscoveryTimeout, "peer-wan-discovery-timeout", peer.DefaultWANQueryTimeout, "timeout of each Consul query about a remote datacenter; one that fails marks that datacenter's discovery stale")
	fs.StringVar(&o.logLevel, "log-level", "info", "trace, debug, info, warn or error")
	fs.BoolVar(&o.pprof, "pprof", false, "serve Go's /debug/pprof on the HTTP address (for profiling)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	o.ramBytes, o.diskBytes, o.maxValue, o.wanBytesPerSecond = int64(ram), int64(disk), int64(maxv), int64(wanRate)
	if o.diskBytes > 0 && o.dataDir == "" {
		return nil, errors.New("--disk-bytes needs --data-dir")
	}
	if o.consulAddr == "" {
		o.consulAddr = os.Getenv("CONSUL_HTTP_ADDR")
	}
	if o.mesh && (o.quicAddr == "" || o.consulAddr == "") {
		return nil, errors.New("--mesh needs --quic-addr and a Consul address (--consul-addr or CONSUL_HTTP_ADDR)")
	}
	if o.mesh && (o.tlsCA != "" || o.tlsCert != "" || o.tlsKey != "" || o.tlsVerifyAddress) {
		return nil, errors.New("--mesh takes the identity from Consul Connect: drop --tls-ca, --tls-cert, --tls-key and --tls-verify-address")
	}
	if o.peerDCs != "" && (o.quicAddr == "" || o.consulAddr == "") {
		return nil, errors.New("--peer-datacenters needs --quic-addr and a Consul address (--consul-addr or CONSUL_HTTP_ADDR)")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	// Caught from the start: SIGHUP's default action would end the process,
	// and Nomad may send it as soon as it renders the password file.
	var hup chan os.Signal
	if o.passwordFile != "" {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	log := hclog.New(&hclog.LoggerOptions{Name: "oasis-kvcached", Level: hclog.LevelFromString(o.logLevel), Output: stderr})

	plan, err := planMemory(o.ramBytes, o.maxValue, o.diskBytes > 0)
	if err != nil {
		return err
	}
	debug.SetMemoryLimit(plan.goLimit)
	// The heap goal follows the live heap plus the plan's headroom (tuneGC):
	// every large SET allocates its value, and a fixed GC percent either
	// collects every few MiB of them when little is stored (a large share of
	// 1 MiB SET throughput at Go's default) or lets the heap grow by GiBs of fresh,
	// page-faulted memory when much is. GOGC in the environment wins.
	if os.Getenv("GOGC") == "" {
		tuneGC(ctx, plan.headroom-plan.pool-plan.unauth)
	}
	budget := resp.NewBudget(plan.inflight)

	password := os.Getenv("OASIS_KVCACHED_PASSWORD")
	if o.passwordFile != "" {
		if password, err = readPassword(o.passwordFile); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := store.NewMetrics(reg)

	var observer store.Observer
	if o.eventsEndpoint != "" {
		p, err := presence.New(ctx, presence.Config{Endpoint: o.eventsEndpoint, ReplayEndpoint: o.eventsReplay,
			BlockSize: o.blockSize, Logger: log.Named("presence"), Registerer: reg})
		if err != nil {
			return err
		}
		defer p.Close()
		observer = p
		log.Info("publishing block presence events", "endpoint", o.eventsEndpoint)
	}

	// The store and the peer node need each other: the store asks peers on a
	// miss, peers serve from the store. remote breaks the cycle.
	remote := &lateRemote{}
	st, err := store.Open(store.Config{
		RAMBytes: plan.tier, DiskBytes: o.diskBytes, Dir: o.dataDir, MaxValue: o.maxValue, PoolBytes: plan.pool,
		Logger: log.Named("store"), Metrics: metrics, Observer: observer, Remote: remote,
	})
	if err != nil {
		return err
	}
	defer st.Close()

	if o.quicAddr != "" {
		node, cleanup, err := startPeers(ctx, o, st, reg, budget, log)
		if err != nil {
			return err
		}
		defer cleanup()
		remote.n = node
	}

	srv, err := server.New(server.Config{Store: st, Logger: log.Named("resp"), Registerer: reg, Password: password, MaxBulk: o.maxValue, Budget: budget,
		UnauthenticatedBytes: plan.unauth, IdleTimeout: disabledIfZero(o.idleTimeout), AuthTimeout: disabledIfZero(o.authTimeout)})
	if err != nil {
		return err
	}
	l, err := net.Listen("tcp", o.addr)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.addr, err)
	}
	if password == "" && !isLoopback(l.Addr()) {
		log.Warn("serving the Redis protocol beyond loopback without a password: anyone who reaches this address can read, overwrite and delete blocks; set --password-file or OASIS_KVCACHED_PASSWORD", "addr", l.Addr().String())
	}
	if hup != nil {
		go reloadPasswordOnHUP(ctx, hup, o.passwordFile, srv, log)
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(l) }()
	log.Info("serving the Redis protocol", "addr", l.Addr().String(), "ram_bytes", o.ramBytes,
		"ram_tier_bytes", plan.tier, "inflight_bytes", plan.inflight, "unauthenticated_bytes", plan.unauth, "go_memory_limit", plan.goLimit,
		"disk_bytes", o.diskBytes, "auth", password != "")

	if o.httpAddr != "" {
		hs, err := serveHTTP(o, reg, st, errc, log)
		if err != nil {
			return err
		}
		defer hs.Close()
	}

	return shutdown(ctx, errc, srv, st, log)
}

// shutdown waits for the end (a signal, or a server that stopped), stops
// the Redis server and flushes the store's blocks to disk; the deferred
// closes of the caller follow.
func shutdown(ctx context.Context, errc <-chan error, srv *server.Server, st *store.Store, log hclog.Logger) error {
	var err error
	select {
	case <-ctx.Done():
		log.Info("shutting down")
	case err = <-errc:
	}
	srv.Close()
	fctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ferr := st.Flush(fctx); ferr != nil {
		log.Warn("flushing blocks to disk before exit", "error", ferr)
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// serveHTTP serves /metrics, /health and, with --pprof, Go's profiles on
// --http-addr; Serve's error goes to errc.
func serveHTTP(o *options, reg *prometheus.Registry, st *store.Store, errc chan<- error, log hclog.Logger) (*http.Server, error) {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	if o.pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	}
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		s := st.Stats()
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"status":"ok","ram_blocks":%d,"disk_blocks":%d,"disk_degraded":%t}`+"\n", s.RAMBlocks, s.DiskBlocks, s.DiskDegraded)
	})
	hl, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", o.httpAddr, err)
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { errc <- hs.Serve(hl) }()
	log.Info("serving HTTP", "addr", hl.Addr().String())
	return hs, nil
}

// startPeers serves peers over QUIC with the node's identity (Consul Connect
// with --mesh, the --tls-* files otherwise) and follows the peer set in
// Consul when there is one. cleanup closes the node, then the identity.
func startPeers(ctx context.Context, o *options, st *store.Store, reg prometheus.Registerer, budget peer.Budget, log hclog.Logger) (*peer.Node, func(), error) {
	var client *consulapi.Client
	if o.consulAddr != "" {
		cc := consulapi.DefaultConfig()
		cc.Address = o.consulAddr
		var err error
		if client, err = consulapi.NewClient(cc); err != nil {
			return nil, nil, fmt.Errorf("creating Consul client: %w", err)
		}
	}
	files := peer.TLSFiles{CA: o.tlsCA, Cert: o.tlsCert, Key: o.tlsKey, ServerName: o.tlsServerName, VerifyAddress: o.tlsVerifyAddress}
	id, err := peerIdentity(ctx, o, files, client, reg, log)
	if err != nil {
		return nil, nil, err
	}
	stls, ctls := peer.IdentityTLS(id, o.consulService, files)
	cfg := peer.Config{ListenAddr: o.quicAddr, ServerTLS: stls, ClientTLS: ctls, Local: st,
		Logger: log.Named("peer"), Registerer: reg, MaxValue: o.maxValue, Budget: budget, FetchTimeout: o.fetchTimeout, FilterInterval: o.filterInterval,
		Datacenters: splitList(o.peerDCs), WANFetchTimeout: o.wanTimeout, WANBytesPerSecond: o.wanBytesPerSecond}
	if id.Mesh() {
		cfg.Authorize = id.Authorize
	}
	node, err := peer.New(cfg)
	if err != nil {
		id.Close()
		return nil, nil, err
	}
	static := splitList(o.peers)
	node.SetPeers(static)
	log.Info("serving peers over QUIC", "addr", node.Addr().String(), "alpn", peer.ALPN, "mesh", id.Mesh())
	if client != nil {
		isSelf := peer.SelfMatcher(o.quicAdvertise, node.Addr())
		go peer.WatchConsul(ctx, peer.ConsulConfig{Client: client, Service: o.consulService, IsSelf: isSelf,
			Static: static, Logger: log.Named("consul"), Set: node.SetPeers})
		watchRemoteDCs(ctx, node, client, o, cfg.Datacenters, isSelf, log.Named("consul"))
	}
	return node, func() { node.Close(); id.Close() }, nil
}

// peerIdentity is the node's mutual-TLS identity: its Connect leaf as
// service --consul-service with --mesh, the --tls-* files otherwise.
func peerIdentity(ctx context.Context, o *options, files peer.TLSFiles, client *consulapi.Client, reg prometheus.Registerer, log hclog.Logger) (*meshid.Identity, error) {
	if !o.mesh {
		return peer.FilesIdentity(files, reg)
	}
	// Bounded: a Consul without Connect, or a token without service:write,
	// must fail the start rather than hang it.
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	id, err := meshid.New(wctx, meshid.Config{Consul: client, Service: o.consulService, Logger: log, Registerer: reg})
	if err != nil {
		return nil, err
	}
	log.Info("peer identity from Consul Connect", "service", o.consulService, "trust_domain", id.TrustDomain())
	return id, nil
}

// watchRemoteDCs follows each remote datacenter's kvcached instances in its
// own goroutine, with its own query timeout, so a datacenter that stops
// answering delays neither local discovery nor the others.
func watchRemoteDCs(ctx context.Context, node *peer.Node, client *consulapi.Client, o *options, dcs []string, isSelf func(string) bool, log hclog.Logger) {
	for _, dc := range dcs {
		go peer.WatchConsul(ctx, peer.ConsulConfig{Client: client, Service: o.consulService, Datacenter: dc,
			QueryTimeout: o.wanDiscoveryTimeout, IsSelf: isSelf, Logger: log,
			Set:   func(addrs []string) { _ = node.SetRemotePeers(dc, addrs) }, // dc is one of the node's
			Stale: func(stale bool) { node.SetDatacenterStale(dc, stale) }})
		log.Info("following kvcached peers in a remote datacenter", "dc", dc, "fetch_timeout", o.wanTimeout, "bytes_per_second", o.wanBytesPerSecond)
	}
}

// readPassword reads the password from path. An empty file is an error
// rather than "no password": a Nomad template whose variable lacks the item
// renders an empty file, and starting without a password then would open
// the store to anyone who reaches it.
func readPassword(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("reading password file: %w", err)
	}
	p := strings.TrimRight(string(b), "\r\n")
	if p == "" {
		return "", fmt.Errorf("password file %s is empty", path)
	}
	return p, nil
}

// reloadPasswordOnHUP reads the password file again on every SIGHUP (what
// the Nomad job's template sends when the password changes), so a new
// password takes effect without a restart, which would empty the RAM tier.
// A file that cannot be read or is empty keeps the current password.
func reloadPasswordOnHUP(ctx context.Context, hup <-chan os.Signal, path string, srv *server.Server, log hclog.Logger) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			p, err := readPassword(path)
			if err != nil {
				log.Error("keeping the current password", "error", err)
				continue
			}
			srv.SetPassword(p)
			log.Info("password reloaded", "file", path)
		}
	}
}

// disabledIfZero maps a flag's 0 (disabled) to server.Config's negative
// (disabled), whose 0 means the default.
func disabledIfZero(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// isLoopback reports whether a listener's address is reachable only from
// this host.
func isLoopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// lateRemote forwards to the peer node once it exists.
type lateRemote struct{ n *peer.Node }

func (r *lateRemote) MayHave(key string) bool { return r.n != nil && r.n.MayHave(key) }

func (r *lateRemote) Fetch(ctx context.Context, key string) ([]byte, error) {
	if r.n == nil {
		return nil, store.ErrNotFound
	}
	return r.n.Fetch(ctx, key)
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
	v, err := parseBytes(s)
	if err != nil {
		return err
	}
	*b = byteFlag(v)
	return nil
}

func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"TiB", 1 << 40},
		{"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
		{"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}, {"T", 1 << 40}, {"B", 1}}
	mult := int64(1)
	for _, u := range units {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 || v > (1<<62)/mult {
		return 0, fmt.Errorf("invalid size %q", s)
	}
	return v * mult, nil
}
