// Package peer lets kvcached instances fetch blocks from each other over QUIC
// with mutual TLS.
//
// # Protocol
//
// ALPN "oasis-kvcached/1", TLS 1.3, both sides present a certificate signed
// by the configured CA (server name DefaultServerName unless configured), or
// in the Consul service mesh their Connect leaf (IdentityTLS). One QUIC
// connection per peer is kept and reused; every request is its own
// bidirectional stream: the client writes the request and closes its send
// side, the server answers and closes the stream. Config.Authorize, when set,
// is asked again on every stream.
//
//	request:  op u8 | key length u16 BE | key
//	response: status u8 | length u64 BE | payload
//
// op 1 (GET) answers status 0 with the block, 1 when absent; op 2 (FILTER)
// answers status 0 with the node's Bloom filter (internal/bloom). Status 2 is
// an error with a UTF-8 message as payload.
//
// # Who holds what
//
// Every FilterInterval each node fetches each peer's Bloom filter of its keys
// (10 bits per key, ~1% false positives: 1.25 MB per million blocks per
// exchange). A local miss asks only the healthy peers whose filter may hold
// the key, so a miss that no peer can answer costs no network round trip; a
// block stored on a peer becomes fetchable within one interval. The filter
// exchange is also the health check: a peer that fails a fetch or a filter
// request (one timeout at most) is skipped until its next filter exchange
// succeeds.
package peer

import (
	"github.com/oasis-llm/oasis/internal/bloom"

	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/kvcached/internal/nozero"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quic-go/quic-go"
)

const (
	opGet    = 1
	opFilter = 2

	statusOK       = 0
	statusNotFound = 1
	statusError    = 2

	// maxKeyLen is the longest key a request's uint16 length field holds.
	// (It was 64 KiB, one more: a key of exactly 65536 bytes went out with
	// length 0 and the peer answered with its block for the empty key.)
	maxKeyLen = 1<<16 - 1
)

// Local is the store a node serves peers from.
type Local interface {
	GetLocal(key string) ([]byte, bool)
	Keys() []string
}

// ReadCoster is optionally implemented by a Local whose GetLocal allocates:
// ReadCost says how many bytes GetLocal(key) will allocate (a block read from
// disk), 0 when it returns memory it already holds (a RAM block).
type ReadCoster interface {
	ReadCost(key string) int64
}

// contextBudget is a Budget whose waits can be cut short: a fetch runs on
// behalf of a command whose reader may hold budget itself, so its wait must
// end with the fetch's deadline rather than possibly never.
type contextBudget interface {
	AcquireContext(ctx context.Context, n int64) error
}

// Budget bounds transient buffers across the process: every fetched block's
// bytes are acquired before its buffer is allocated and released once Fetch
// has returned it, and a block served from disk holds its bytes until sent.
type Budget interface {
	Acquire(n int64)
	Release(n int64)
}

// ErrNotFound means no peer holds the key.
var ErrNotFound = errors.New("block not found on any peer")

// Config configures a Node.
type Config struct {
	// ListenAddr is the UDP address to serve peers on, e.g. "127.0.0.1:7380".
	ListenAddr string
	ServerTLS  *tls.Config
	// ClientTLS dials peers. With ServerName empty, each peer's certificate
	// must name the host it is dialled at (its address or DNS name), so a
	// node holding a certificate for itself cannot answer as another;
	// otherwise every peer's certificate carries that one name.
	ClientTLS *tls.Config
	// Authorize, optional, decides again on every stream a peer opens
	// whether its connection's caller may stay; an error closes the
	// connection. Connections are kept and reused for as long as the peer
	// answers, so a decision taken only at the handshake (Consul
	// intentions) would otherwise never reach a caller already connected.
	Authorize func(tls.ConnectionState) error
	Local     Local
	// Logger receives the node's logs; nil discards them.
	Logger hclog.Logger
	// Registerer takes the node's metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// MaxValue bounds a fetched block.
	MaxValue int64
	// FetchTimeout bounds one fetch, dial included (default 2s).
	FetchTimeout time.Duration
	// FilterInterval is how often peers' filters are refreshed (default 2s).
	FilterInterval time.Duration
	// MaxConcurrent bounds fetches in flight from this node (default 32).
	MaxConcurrent int
	// Budget, optional, bounds the memory of fetch and serve buffers.
	Budget Budget

	// Datacenters are the remote Consul datacenters whose kvcached are
	// peers too (SetRemotePeers), asked in this order only after every
	// local peer that may hold a key missed. Empty: local peers only.
	Datacenters []string
	// WANFetchTimeout bounds one fetch from a remote datacenter's peer,
	// dial included (default 5s).
	WANFetchTimeout time.Duration
	// WANBytesPerSecond caps the block bytes this node pulls from each
	// remote datacenter (a token bucket holding one second's worth): a
	// fetch that would exceed it is skipped as a miss, not queued, since
	// recomputing the prefix beats waiting for the link. 0: no cap.
	WANBytesPerSecond int64
	// Now is the clock of the WAN budget (default time.Now); for tests.
	Now func() time.Time
}

// peerKey names a peer: the same address may in principle be listed by
// the local catalog and a remote one.
type peerKey struct{ dc, addr string }

type peerState struct {
	addr string
	// dc is the remote datacenter the peer is in, "" for a local peer.
	dc      string
	timeout time.Duration

	mu      sync.Mutex
	conn    *quic.Conn
	dialing chan struct{} // closed when a dial in progress ends
	filter  *bloom.Filter
	healthy bool
}

// Node serves this node's blocks and fetches others'.
type Node struct {
	cfg       Config
	log       hclog.Logger
	ln        *quic.Listener
	tr        *quic.Transport
	udp       net.PacketConn
	closeOnce sync.Once
	sem       chan struct{}
	qc        *quic.Config

	mu    sync.Mutex
	peers map[peerKey]*peerState
	stale map[string]bool // remote datacenters whose discovery is stale

	dcs map[string]*remoteDC
	wan *wanMetrics

	filterMu    sync.Mutex
	filterBytes []byte
	filterAt    time.Time

	// stop ends Run at Close; closed (under mu) keeps Run from starting after.
	stop   context.Context
	cancel context.CancelFunc
	closed bool
	wg     sync.WaitGroup

	mFetches  *prometheus.CounterVec
	mLatency  prometheus.Histogram
	mHealthy  prometheus.Gauge
	mServed   *prometheus.CounterVec
	mFilterSz prometheus.Gauge
	mDenied   prometheus.Counter
	// mExchanges counts this node's filter fetches by result.
	mExchanges *prometheus.CounterVec
}

// errCodeDenied closes a connection whose caller Config.Authorize refused.
const errCodeDenied quic.ApplicationErrorCode = 0x10

// validate refuses a Config New cannot start with and fills in defaults.
func (c *Config) validate() error {
	if c.ServerTLS == nil || c.ClientTLS == nil {
		return errors.New("starting peer node: mutual TLS configuration is required")
	}
	if c.Local == nil {
		return errors.New("starting peer node: a local store is required")
	}
	if c.Logger == nil {
		c.Logger = hclog.NewNullLogger()
	}
	if c.Registerer == nil {
		c.Registerer = prometheus.NewRegistry()
	}
	if c.MaxValue <= 0 {
		c.MaxValue = 64 << 20
	}
	if c.FetchTimeout <= 0 {
		c.FetchTimeout = 2 * time.Second
	}
	if c.FilterInterval <= 0 {
		c.FilterInterval = 2 * time.Second
	}
	if c.MaxConcurrent <= 0 {
		c.MaxConcurrent = 32
	}
	if c.WANFetchTimeout <= 0 {
		c.WANFetchTimeout = 5 * time.Second
	}
	if c.WANBytesPerSecond < 0 {
		return &ConfigError{Field: "WANBytesPerSecond", Reason: "negative"}
	}
	return validateDatacenters(c.Datacenters)
}

// New binds cfg.ListenAddr; Run serves peers there. Fetches work without Run.
func New(cfg Config) (*Node, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	n := &Node{
		cfg: cfg, log: cfg.Logger, peers: map[peerKey]*peerState{}, stale: map[string]bool{},
		dcs: map[string]*remoteDC{},
		sem: make(chan struct{}, cfg.MaxConcurrent),
		qc: &quic.Config{
			MaxIdleTimeout:  30 * time.Second,
			KeepAlivePeriod: 10 * time.Second,
			// The dial's context bounds each handshake by its peer's
			// timeout; this only must not cut a WAN handshake shorter.
			HandshakeIdleTimeout:           max(cfg.FetchTimeout, cfg.WANFetchTimeout),
			InitialStreamReceiveWindow:     4 << 20,
			MaxStreamReceiveWindow:         64 << 20,
			InitialConnectionReceiveWindow: 8 << 20,
			MaxConnectionReceiveWindow:     256 << 20,
			MaxIncomingStreams:             1024,
		},
	}
	udp, err := net.ListenPacket("udp", cfg.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("listening for peers on %s: %w", cfg.ListenAddr, err)
	}
	n.udp = udp
	n.tr = &quic.Transport{Conn: udp}
	n.ln, err = n.tr.Listen(cfg.ServerTLS, n.qc)
	if err != nil {
		udp.Close()
		return nil, fmt.Errorf("listening for peers: %w", err)
	}
	n.mFetches = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_peer_fetches_total", Help: "Block fetches from peers, by result (hit, miss, error, timeout)."}, []string{"result"})
	n.mLatency = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "oasis_kvcached_peer_fetch_seconds", Help: "Latency of successful peer fetches.",
		Buckets: []float64{.0005, .001, .002, .005, .01, .02, .05, .1, .2, .5, 1, 2}})
	n.mHealthy = prometheus.NewGauge(prometheus.GaugeOpts{Name: "oasis_kvcached_peers_healthy", Help: "Peers whose last exchange succeeded."})
	n.mServed = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_peer_requests_served_total", Help: "Requests served to peers, by op (get, filter) and result."}, []string{"op", "result"})
	n.mFilterSz = prometheus.NewGauge(prometheus.GaugeOpts{Name: "oasis_kvcached_peer_filter_bytes", Help: "Size of this node's membership filter as sent to peers."})
	n.mDenied = prometheus.NewCounter(prometheus.CounterOpts{Name: "oasis_kvcached_peer_connections_denied_total", Help: "Established peer connections closed because their caller is no longer authorized (Consul intentions)."})
	n.mExchanges = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_peer_filter_exchanges_total", Help: "This node's fetches of a peer's membership filter (its health check), by result (ok, error)."}, []string{"result"})
	cfg.Registerer.MustRegister(n.mFetches, n.mLatency, n.mHealthy, n.mServed, n.mFilterSz, n.mDenied, n.mExchanges)
	n.mExchanges.WithLabelValues("ok")
	n.mExchanges.WithLabelValues("error")
	for _, r := range []string{"hit", "miss", "error", "timeout"} {
		n.mFetches.WithLabelValues(r)
	}
	for _, dc := range cfg.Datacenters {
		n.dcs[dc] = &remoteDC{name: dc, bucket: newTokenBucket(cfg.WANBytesPerSecond, cfg.Now)}
	}
	n.wan = newWANMetrics(cfg.Registerer, cfg.Datacenters)
	n.stop, n.cancel = context.WithCancel(context.Background())
	return n, nil
}

// Run serves peers' connections and exchanges membership filters until ctx
// ends or Close; it returns nil then.
func (n *Node) Run(ctx context.Context) error {
	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		return nil
	}
	n.wg.Add(2)
	n.mu.Unlock()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(n.stop, cancel)()
	go n.accept(ctx)
	go n.refreshLoop(ctx)
	<-ctx.Done()
	return nil
}

// Addr is the UDP address peers reach this node on.
func (n *Node) Addr() net.Addr { return n.ln.Addr() }

// Close stops serving and closes peer connections.
func (n *Node) Close() error {
	var err error
	n.closeOnce.Do(func() { err = n.close() })
	return err
}

func (n *Node) close() error {
	n.mu.Lock()
	n.closed = true
	n.mu.Unlock()
	n.cancel()
	n.ln.Close()
	n.mu.Lock()
	for _, p := range n.peers {
		p.mu.Lock()
		if p.conn != nil {
			p.conn.CloseWithError(0, "shutting down")
		}
		p.mu.Unlock()
	}
	n.mu.Unlock()
	n.wg.Wait()
	err := n.tr.Close()
	if cerr := n.udp.Close(); err == nil && !errors.Is(cerr, net.ErrClosed) {
		err = cerr
	}
	return err
}

// SetPeers replaces the local peer set (addresses host:port); connections
// to peers that left are closed, those to peers that stay are kept.
func (n *Node) SetPeers(addrs []string) { n.setPeers("", addrs) }

// setPeers replaces datacenter dc's peer set ("" local).
func (n *Node) setPeers(dc string, addrs []string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	timeout := n.cfg.FetchTimeout
	if dc != "" {
		timeout = n.cfg.WANFetchTimeout
	}
	want := map[peerKey]bool{}
	for _, a := range addrs {
		k := peerKey{dc, a}
		want[k] = true
		if _, ok := n.peers[k]; !ok {
			n.peers[k] = &peerState{addr: a, dc: dc, timeout: timeout}
		}
	}
	for k, p := range n.peers {
		if k.dc == dc && !want[k] {
			p.mu.Lock()
			if p.conn != nil {
				p.conn.CloseWithError(0, "peer left")
			}
			p.mu.Unlock()
			delete(n.peers, k)
		}
	}
	n.updateHealthyLocked()
}

// Peers returns the current local peer addresses, sorted.
func (n *Node) Peers() []string { return n.peersIn("") }

func (n *Node) peersIn(dc string) []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []string
	for k := range n.peers {
		if k.dc == dc {
			out = append(out, k.addr)
		}
	}
	slices.Sort(out)
	return out
}

func (n *Node) updateHealthyLocked() {
	h := 0
	for _, p := range n.peers {
		p.mu.Lock()
		if p.healthy {
			h++
		}
		p.mu.Unlock()
	}
	n.mHealthy.Set(float64(h))
}

// candidates returns the healthy peers whose filter may hold key: local
// ones first, then each remote datacenter's in Config.Datacenters order.
func (n *Node) candidates(key string) []*peerState {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []*peerState
	for _, p := range n.peers {
		p.mu.Lock()
		ok := p.healthy && p.filter.MayHave(key)
		p.mu.Unlock()
		if ok {
			out = append(out, p)
		}
	}
	rank := func(dc string) int {
		if dc == "" {
			return -1
		}
		return slices.Index(n.cfg.Datacenters, dc)
	}
	slices.SortStableFunc(out, func(a, b *peerState) int { return rank(a.dc) - rank(b.dc) })
	return out
}

// MayHave reports whether some healthy peer's filter may hold key.
func (n *Node) MayHave(key string) bool { return len(n.candidates(key)) > 0 }

// Fetch asks the peers that may hold key, one after another (local peers
// first, then remote datacenters' within their byte budget), and returns the
// first copy found.
func (n *Node) Fetch(ctx context.Context, key string) ([]byte, error) {
	if len(key) > maxKeyLen {
		return nil, fmt.Errorf("key of %d bytes is too long for a peer fetch", len(key))
	}
	spent := ""
	for _, p := range n.candidates(key) {
		if p.dc != "" && p.dc == spent {
			continue // one budget skip per datacenter and fetch
		}
		if d := n.dcs[p.dc]; d != nil && !d.admitsEstimate() {
			n.recordWAN(p.dc, ErrWANBudget, 0)
			spent = p.dc
			continue
		}
		select {
		case n.sem <- struct{}{}:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		v, err := n.fetchOne(ctx, p, key)
		<-n.sem
		if err == nil {
			return v, nil
		}
		if errors.Is(err, ErrWANBudget) {
			spent = p.dc
		}
	}
	return nil, ErrNotFound
}

// fetchOne asks one peer and counts the outcome.
func (n *Node) fetchOne(ctx context.Context, p *peerState, key string) ([]byte, error) {
	start := time.Now()
	v, err := n.fetchFrom(ctx, p, key)
	if v != nil && n.cfg.Budget != nil {
		// The caller stores v at once, where the RAM tier counts it.
		n.cfg.Budget.Release(int64(len(v)))
	}
	if p.dc != "" {
		n.recordWAN(p.dc, err, len(v))
		if err == nil {
			n.dcs[p.dc].lastSize.Store(int64(len(v)))
		}
	}
	switch {
	case err == nil:
		n.mFetches.WithLabelValues("hit").Inc()
		n.mLatency.Observe(time.Since(start).Seconds())
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrWANBudget):
		n.mFetches.WithLabelValues("miss").Inc()
	default:
		if errors.Is(err, context.DeadlineExceeded) {
			n.mFetches.WithLabelValues("timeout").Inc()
		} else {
			n.mFetches.WithLabelValues("error").Inc()
		}
		n.log.Warn("peer fetch failed; skipping the peer until it answers again", "peer", p.addr, "dc", p.dc, "error", err)
		n.markDown(p)
	}
	return v, err
}

func (n *Node) markDown(p *peerState) {
	p.mu.Lock()
	p.healthy = false
	if p.conn != nil {
		p.conn.CloseWithError(0, "peer marked down")
		p.conn = nil
	}
	p.mu.Unlock()
	n.mu.Lock()
	n.updateHealthyLocked()
	n.mu.Unlock()
}

// conn returns the peer's connection, dialling once if needed; concurrent
// callers share one dial.
func (n *Node) conn(ctx context.Context, p *peerState) (*quic.Conn, error) {
	for {
		p.mu.Lock()
		if p.conn != nil && p.conn.Context().Err() == nil {
			c := p.conn
			p.mu.Unlock()
			return c, nil
		}
		if p.dialing != nil {
			ch := p.dialing
			p.mu.Unlock()
			select {
			case <-ch:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		ch := make(chan struct{})
		p.dialing = ch
		p.mu.Unlock()

		addr, err := net.ResolveUDPAddr("udp", p.addr)
		var c *quic.Conn
		if err == nil {
			tlsConf := n.cfg.ClientTLS
			if tlsConf.ServerName == "" {
				// The name dialled, not the address it resolved to: a peer
				// given by DNS name has that name in its certificate.
				host, _, _ := net.SplitHostPort(p.addr)
				tlsConf = withServerName(tlsConf, host)
			}
			c, err = n.tr.Dial(ctx, addr, tlsConf, n.qc)
		}
		p.mu.Lock()
		p.dialing = nil
		if err == nil {
			p.conn = c
		}
		p.mu.Unlock()
		close(ch)
		if err != nil {
			return nil, fmt.Errorf("dialling peer %s: %w", p.addr, err)
		}
		return c, nil
	}
}

// withServerName is c dialling host. crypto/tls leaves an IP address out of
// ConnectionState.ServerName (SNI carries no addresses), so a VerifyConnection
// that checks the name there (meshid's, with files) is handed host instead of
// "", which would skip the check.
func withServerName(c *tls.Config, host string) *tls.Config {
	c = c.Clone()
	c.ServerName = host
	if verify := c.VerifyConnection; verify != nil {
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if cs.ServerName == "" {
				cs.ServerName = host
			}
			return verify(cs)
		}
	}
	return c
}

func (n *Node) request(ctx context.Context, p *peerState, op byte, key string, max int64) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	c, err := n.conn(ctx, p)
	if err != nil {
		return nil, err
	}
	s, err := c.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("opening stream to %s: %w", p.addr, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		s.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { s.CancelRead(1); s.CancelWrite(1) })
	defer stop()
	req := make([]byte, 3+len(key))
	req[0] = op
	binary.BigEndian.PutUint16(req[1:], uint16(len(key)))
	copy(req[3:], key)
	if _, err := s.Write(req); err != nil {
		return nil, n.ctxErr(ctx, fmt.Errorf("sending request to %s: %w", p.addr, err))
	}
	s.Close()
	var hdr [9]byte
	if _, err := io.ReadFull(s, hdr[:]); err != nil {
		return nil, n.ctxErr(ctx, fmt.Errorf("reading reply from %s: %w", p.addr, err))
	}
	l := binary.BigEndian.Uint64(hdr[1:])
	if l > uint64(max) {
		s.CancelRead(2)
		return nil, fmt.Errorf("peer %s sent %d bytes, over the %d-byte limit", p.addr, l, max)
	}
	if d := n.dcs[p.dc]; op == opGet && hdr[0] == statusOK && d != nil && !d.bucket.take(int64(l)) {
		// The estimate let the request go but the block is larger than
		// what is left: refuse it now, before its bytes cross the link
		// (beyond what the stream's window already let through).
		d.lastSize.Store(int64(l))
		s.CancelRead(3)
		return nil, fmt.Errorf("%d-byte block from %s in %s: %w", l, p.addr, p.dc, ErrWANBudget)
	}
	budgeted := op == opGet && hdr[0] == statusOK && n.cfg.Budget != nil
	if budgeted {
		if bc, ok := n.cfg.Budget.(contextBudget); ok {
			if err := bc.AcquireContext(ctx, int64(l)); err != nil {
				s.CancelRead(2)
				return nil, n.ctxErr(ctx, fmt.Errorf("waiting for memory for a block from %s: %w", p.addr, err))
			}
		} else {
			n.cfg.Budget.Acquire(int64(l))
		}
	}
	// Every byte is read before the body is used.
	body := nozero.Make(int(l))
	if _, err := io.ReadFull(s, body); err != nil {
		if budgeted {
			n.cfg.Budget.Release(int64(l))
		}
		return nil, n.ctxErr(ctx, fmt.Errorf("reading reply from %s: %w", p.addr, err))
	}
	switch hdr[0] {
	case statusOK:
		return body, nil // Fetch releases the budget
	case statusNotFound:
		return nil, ErrNotFound
	default:
		return nil, fmt.Errorf("peer %s: %s", p.addr, body)
	}
}

// ctxErr prefers the context's error so timeouts are reported as such.
func (n *Node) ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return fmt.Errorf("%w: %v", ctx.Err(), err)
	}
	return err
}

func (n *Node) fetchFrom(ctx context.Context, p *peerState, key string) ([]byte, error) {
	return n.request(ctx, p, opGet, key, n.cfg.MaxValue)
}

func (n *Node) refreshLoop(ctx context.Context) {
	defer n.wg.Done()
	t := time.NewTicker(n.cfg.FilterInterval)
	defer t.Stop()
	for {
		n.RefreshFilters(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RefreshFilters fetches every peer's filter now, in parallel; it is also
// the health check that brings a peer marked down back.
func (n *Node) RefreshFilters(ctx context.Context) {
	n.mu.Lock()
	peers := make([]*peerState, 0, len(n.peers))
	for _, p := range n.peers {
		peers = append(peers, p)
	}
	n.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, err := n.request(ctx, p, opFilter, "", 1<<30)
			var f *bloom.Filter
			if err == nil {
				f, err = bloom.Unmarshal(b)
			}
			if p.dc != "" {
				n.wan.bytes.WithLabelValues(p.dc, "filter").Add(float64(len(b)))
			}
			if ctx.Err() == nil {
				n.mExchanges.WithLabelValues(map[bool]string{true: "ok", false: "error"}[err == nil]).Inc()
			}
			p.mu.Lock()
			was := p.healthy
			if err != nil {
				p.healthy = false
				if p.conn != nil {
					p.conn.CloseWithError(0, "filter exchange failed")
					p.conn = nil
				}
			} else {
				p.healthy, p.filter = true, f
			}
			p.mu.Unlock()
			if err != nil && was && ctx.Err() == nil {
				n.log.Warn("peer unreachable; skipping it until it answers", "peer", p.addr, "dc", p.dc, "error", err)
			} else if err == nil && !was {
				n.log.Info("peer healthy", "peer", p.addr, "dc", p.dc)
			}
		}()
	}
	wg.Wait()
	n.mu.Lock()
	n.updateHealthyLocked()
	n.mu.Unlock()
}

// --- serving ---

func (n *Node) accept(ctx context.Context) {
	defer n.wg.Done()
	for {
		c, err := n.ln.Accept(ctx)
		if err != nil {
			return
		}
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			for {
				s, err := c.AcceptStream(ctx)
				if err != nil {
					return
				}
				n.wg.Add(1)
				go func() {
					defer n.wg.Done()
					if n.authorized(c, s) {
						n.serveStream(s)
					}
				}()
			}
		}()
	}
}

// authorized asks Config.Authorize about the stream's connection and closes
// the connection when its caller is refused. Checked in the stream's own
// goroutine: an answer that is not cached waits on the Consul agent.
func (n *Node) authorized(c *quic.Conn, s *quic.Stream) bool {
	if n.cfg.Authorize == nil {
		return true
	}
	err := n.cfg.Authorize(c.ConnectionState().TLS)
	if err == nil {
		return true
	}
	s.CancelRead(1)
	s.CancelWrite(1)
	if c.Context().Err() == nil {
		n.mDenied.Inc()
		n.log.Warn("closing a peer connection: its caller is no longer authorized", "peer", c.RemoteAddr().String(), "error", err)
	}
	c.CloseWithError(errCodeDenied, "not authorized")
	return false
}

func (n *Node) serveStream(s *quic.Stream) {
	defer s.Close()
	s.SetDeadline(time.Now().Add(n.cfg.FetchTimeout + 5*time.Second))
	var hdr [3]byte
	if _, err := io.ReadFull(s, hdr[:]); err != nil {
		s.CancelRead(1)
		return
	}
	key := make([]byte, binary.BigEndian.Uint16(hdr[1:]))
	if _, err := io.ReadFull(s, key); err != nil {
		s.CancelRead(1)
		return
	}
	switch hdr[0] {
	case opGet:
		if rc, ok := n.cfg.Local.(ReadCoster); ok && n.cfg.Budget != nil {
			if cost := rc.ReadCost(string(key)); cost > 0 {
				n.cfg.Budget.Acquire(cost)
				defer n.cfg.Budget.Release(cost)
			}
		}
		v, ok := n.cfg.Local.GetLocal(string(key))
		if !ok {
			n.mServed.WithLabelValues("get", "miss").Inc()
			reply(s, statusNotFound, nil)
			return
		}
		n.mServed.WithLabelValues("get", "hit").Inc()
		reply(s, statusOK, v)
	case opFilter:
		n.mServed.WithLabelValues("filter", "ok").Inc()
		reply(s, statusOK, n.filter())
	default:
		n.mServed.WithLabelValues("unknown", "error").Inc()
		reply(s, statusError, []byte(fmt.Sprintf("unknown op %d", hdr[0])))
	}
}

func reply(s *quic.Stream, status byte, body []byte) {
	var hdr [9]byte
	hdr[0] = status
	binary.BigEndian.PutUint64(hdr[1:], uint64(len(body)))
	if _, err := s.Write(hdr[:]); err != nil {
		return
	}
	s.Write(body)
}

// filter returns this node's membership filter, rebuilt at most twice per
// FilterInterval however many peers ask.
func (n *Node) filter() []byte {
	n.filterMu.Lock()
	defer n.filterMu.Unlock()
	if n.filterBytes != nil && time.Since(n.filterAt) < n.cfg.FilterInterval/2 {
		return n.filterBytes
	}
	keys := n.cfg.Local.Keys()
	f := bloom.New(len(keys))
	for _, k := range keys {
		f.Add(k)
	}
	n.filterBytes = f.Marshal()
	n.filterAt = time.Now()
	n.mFilterSz.Set(float64(len(n.filterBytes)))
	return n.filterBytes
}
