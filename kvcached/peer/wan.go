package peer

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"
)

// Peers in other datacenters.
//
// Remote datacenters are opt-in (Config.Datacenters): moving a long prefix's
// KV cache over a WAN link takes longer than recomputing it (see
// kvcached/README.md, "Peers in other datacenters"). A remote datacenter's
// peers are asked only after every local peer that may hold the key missed,
// with their own timeout, and the block bytes this node pulls from each
// remote datacenter draw on that datacenter's token bucket: the fetching
// side enforces the WAN budget, since it is the one that knows which link
// a fetch crosses; the serving side keeps the limits it applies to every
// peer.

// ErrWANBudget means a fetch from a remote datacenter was skipped because
// it would have exceeded that datacenter's bytes-per-second budget.
var ErrWANBudget = errors.New("remote datacenter's byte budget is spent")

// ConfigError is a Config that New refuses.
type ConfigError struct {
	Field, Reason string
}

func (e *ConfigError) Error() string {
	return fmt.Sprintf("starting peer node: %s: %s", e.Field, e.Reason)
}

// dcName is what Consul accepts as a datacenter name (alphanumerics,
// hyphens, underscores).
var dcName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

func validateDatacenters(dcs []string) error {
	for i, dc := range dcs {
		if !dcName.MatchString(dc) {
			return &ConfigError{Field: "Datacenters", Reason: fmt.Sprintf("%q is not a datacenter name", dc)}
		}
		if slices.Contains(dcs[:i], dc) {
			return &ConfigError{Field: "Datacenters", Reason: fmt.Sprintf("%q is listed twice", dc)}
		}
	}
	return nil
}

// tokenBucket admits bytes at rate per second with a burst of one second's
// worth (golang.org/x/time/rate, on the node's clock). A nil bucket admits
// everything.
type tokenBucket struct {
	now func() time.Time
	lim *rate.Limiter
}

func newTokenBucket(bytesPerSecond int64, now func() time.Time) *tokenBucket {
	if bytesPerSecond <= 0 {
		return nil
	}
	if now == nil {
		now = time.Now
	}
	return &tokenBucket{now: now, lim: rate.NewLimiter(rate.Limit(bytesPerSecond), int(bytesPerSecond))}
}

// has reports whether n bytes would be admitted now, taking nothing.
func (b *tokenBucket) has(n int64) bool {
	return b == nil || b.lim.TokensAt(b.now()) >= float64(n)
}

// take admits n bytes if the bucket holds them; otherwise it takes nothing,
// so a refused fetch costs the budget nothing.
func (b *tokenBucket) take(n int64) bool {
	return b == nil || b.lim.AllowN(b.now(), int(n))
}

// remoteDC is one remote datacenter's budget and the size of the last block
// fetched from it. That size is the estimate a fetch is checked against
// before it is sent: the true size is known only from the reply's header,
// and a reply refused then has already sent up to a flow-control window.
type remoteDC struct {
	name     string
	bucket   *tokenBucket
	lastSize atomic.Int64
}

func (d *remoteDC) admitsEstimate() bool { return d.bucket.has(max(1, d.lastSize.Load())) }

// wanMetrics are the per-datacenter series.
type wanMetrics struct {
	fetches    *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	stale      *prometheus.GaugeVec
	staleTotal *prometheus.CounterVec
	queries    *prometheus.CounterVec
}

func newWANMetrics(reg prometheus.Registerer, dcs []string) *wanMetrics {
	m := &wanMetrics{
		fetches: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_peer_wan_fetches_total",
			Help: "Block fetches from peers in remote datacenters, by datacenter and result (hit, miss, error, timeout, budget)."}, []string{"dc", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_peer_wan_bytes_total",
			Help: "Bytes received from peers in remote datacenters, by datacenter and kind (block, filter)."}, []string{"dc", "kind"}),
		stale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "oasis_kvcached_peer_discovery_stale",
			Help: "1 while a remote datacenter's Consul does not answer discovery queries (its last known peers are kept)."}, []string{"dc"}),
		staleTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_peer_discovery_stale_total",
			Help: "Times a remote datacenter's discovery went stale."}, []string{"dc"}),
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_peer_discovery_queries_total",
			Help: "Discovery queries to a remote datacenter's Consul, by datacenter and result (ok, error); a blocking query that saw no change counts as ok."},
			[]string{"dc", "result"}),
	}
	reg.MustRegister(m.fetches, m.bytes, m.stale, m.staleTotal, m.queries)
	for _, dc := range dcs {
		for _, r := range []string{"hit", "miss", "error", "timeout", "budget"} {
			m.fetches.WithLabelValues(dc, r)
		}
		m.bytes.WithLabelValues(dc, "block")
		m.bytes.WithLabelValues(dc, "filter")
		m.stale.WithLabelValues(dc)
		m.staleTotal.WithLabelValues(dc)
		m.queries.WithLabelValues(dc, "ok")
		m.queries.WithLabelValues(dc, "error")
	}
	return m
}

// SetRemotePeers replaces the peer set of remote datacenter dc, one of
// Config.Datacenters; it leaves local peers and other datacenters alone.
func (n *Node) SetRemotePeers(dc string, addrs []string) error {
	if n.dcs[dc] == nil {
		return &ConfigError{Field: "Datacenters", Reason: fmt.Sprintf("%q is not a configured remote datacenter", dc)}
	}
	n.setPeers(dc, addrs)
	return nil
}

// RemotePeers returns remote datacenter dc's peer addresses, sorted.
func (n *Node) RemotePeers(dc string) []string { return n.peersIn(dc) }

// SetDatacenterStale records whether dc's discovery is stale: its Consul
// stopped answering, so its peer set may be out of date.
func (n *Node) SetDatacenterStale(dc string, stale bool) {
	if n.dcs[dc] == nil {
		return
	}
	if n.staleNow(dc, stale) && stale {
		n.wan.staleTotal.WithLabelValues(dc).Inc()
	}
	v := 0.0
	if stale {
		v = 1
	}
	n.wan.stale.WithLabelValues(dc).Set(v)
}

// CountDiscoveryQuery counts the outcome of a discovery query to dc's Consul.
func (n *Node) CountDiscoveryQuery(dc string, err error) {
	if n.dcs[dc] == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	n.wan.queries.WithLabelValues(dc, result).Inc()
}

// staleNow sets dc's staleness and reports whether it changed.
func (n *Node) staleNow(dc string, stale bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	was := n.stale[dc]
	n.stale[dc] = stale
	return was != stale
}

// DatacenterStale reports whether dc's discovery is stale.
func (n *Node) DatacenterStale(dc string) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.stale[dc]
}

// recordWAN counts a remote fetch's outcome.
func (n *Node) recordWAN(dc string, err error, size int) {
	r := "error"
	switch {
	case err == nil:
		r = "hit"
		n.wan.bytes.WithLabelValues(dc, "block").Add(float64(size))
	case errors.Is(err, ErrNotFound):
		r = "miss"
	case errors.Is(err, ErrWANBudget):
		r = "budget"
	case errors.Is(err, context.DeadlineExceeded):
		r = "timeout"
	}
	n.wan.fetches.WithLabelValues(dc, r).Inc()
}
