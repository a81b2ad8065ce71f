package peer

import (
	"context"
	"errors"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
)

// QUICPortMeta is the service-meta key carrying a kvcached instance's QUIC
// port; the service's own port is its Redis port.
const QUICPortMeta = "oasis_quic_port"

// ConsulConfig says whose instances WatchConsul follows and where their
// addresses go.
type ConsulConfig struct {
	// Client reaches the Consul agent; required.
	Client *consulapi.Client
	// Service is the kvcached service's name in the catalog.
	Service string
	// Datacenter, when set, names a remote Consul datacenter whose
	// instances are followed (queries with ?dc=) instead of the agent's own.
	Datacenter string
	// QueryTimeout bounds each query (default: none for the local
	// datacenter, 10s for a remote one). A query forwarded to a remote
	// datacenter whose servers froze hangs for a minute or more: its own
	// timeout is what marks that datacenter stale.
	QueryTimeout time.Duration
	// IsSelf reports whether a QUIC address is this node's own (see
	// SelfMatcher); nil counts none as its own.
	IsSelf func(addr string) bool
	// Static are peers kept in the set beside the catalog's.
	Static []string
	// Logger receives the watch's logs; nil discards them.
	Logger hclog.Logger
	// Set receives the peer set whenever it changes; required.
	Set func(addrs []string)
	// Stale, optional, is told when queries start failing (true) and
	// answer again (false); the last peer set is kept meanwhile.
	Stale func(stale bool)
	// Queried, optional, is told the outcome of every query: nil when it
	// was answered (a blocking query that saw no change included).
	Queried func(err error)
}

// DefaultWANQueryTimeout bounds a discovery query to a remote datacenter.
const DefaultWANQueryTimeout = 10 * time.Second

// WatchConsul follows the passing instances of cfg.Service in Consul's
// catalog with blocking queries and calls cfg.Set with their QUIC addresses
// (its own excluded, cfg.Static added) whenever the set changes, until ctx
// ends.
func WatchConsul(ctx context.Context, cfg ConsulConfig) {
	w := newConsulWatch(cfg)
	if cfg.Datacenter != "" {
		w.checkToken(ctx)
	}
	var index uint64
	var last []string
	backoff := time.Second
	for ctx.Err() == nil {
		entries, meta, err := w.query(ctx, index)
		if ctx.Err() != nil {
			return
		}
		if cfg.Queried != nil {
			cfg.Queried(err)
		}
		if err != nil {
			w.failed(err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		w.answered()
		backoff = time.Second
		if meta.LastIndex < index {
			index = 0 // the index went backwards: start over, as Consul advises
		} else {
			index = meta.LastIndex
		}
		addrs := w.addrs(entries)
		if !slices.Equal(addrs, last) {
			w.log.Info("kvcached peer set changed", "peers", addrs)
			cfg.Set(addrs)
			last = addrs
		}
	}
}

// consulWatch is one WatchConsul's state.
type consulWatch struct {
	cfg   ConsulConfig
	log   hclog.Logger
	wait  time.Duration
	stale bool
}

func newConsulWatch(cfg ConsulConfig) *consulWatch {
	w := &consulWatch{cfg: cfg, log: cfg.Logger, wait: 5 * time.Minute}
	if w.log == nil {
		w.log = hclog.NewNullLogger()
	}
	if cfg.Datacenter != "" {
		w.log = w.log.With("dc", cfg.Datacenter)
		if cfg.QueryTimeout <= 0 {
			w.cfg.QueryTimeout = DefaultWANQueryTimeout
		}
	}
	if w.cfg.IsSelf == nil {
		w.cfg.IsSelf = func(string) bool { return false }
	}
	if t := w.cfg.QueryTimeout; t > 0 {
		// Consul adds up to 1/16 of the wait as jitter: a blocking query
		// that simply saw no change still answers within the timeout.
		w.wait = t * 3 / 4
	}
	return w
}

func (w *consulWatch) query(ctx context.Context, index uint64) ([]*consulapi.ServiceEntry, *consulapi.QueryMeta, error) {
	if w.cfg.QueryTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, w.cfg.QueryTimeout)
		defer cancel()
	}
	q := &consulapi.QueryOptions{Datacenter: w.cfg.Datacenter, WaitIndex: index, WaitTime: w.wait}
	if w.cfg.Datacenter != "" {
		// The agent's streaming backend answers a blocking ?dc= health
		// query from its own materialized view when the wait ends, with no
		// error, even while the remote servers are frozen: a freeze would
		// never show. A query sorted by distance to the agent does not use
		// streaming, so it reaches the remote servers and times out under
		// our deadline when they do not answer.
		q.Near = "_agent"
	}
	entries, meta, err := w.cfg.Client.Health().Service(w.cfg.Service, "", true, q.WithContext(ctx))
	if err == nil && w.cfg.Datacenter != "" && !meta.KnownLeader {
		return nil, nil, errNoLeader
	}
	return entries, meta, err
}

// errNoLeader is a remote datacenter's answer given without a leader: it
// may be out of date, so the datacenter counts as stale.
var errNoLeader = errors.New("remote datacenter answered without a known leader")

// failed logs a failed query, and for a remote datacenter marks it stale,
// logging that once until it answers again.
func (w *consulWatch) failed(err error) {
	if w.cfg.Datacenter == "" {
		w.log.Warn("listing kvcached peers in Consul", "error", err)
		return
	}
	if w.stale {
		w.log.Debug("remote datacenter still not answering", "error", err)
		return
	}
	w.stale = true
	w.log.Warn("remote datacenter's Consul is not answering; keeping its last known peers", "error", err)
	if w.cfg.Stale != nil {
		w.cfg.Stale(true)
	}
}

func (w *consulWatch) answered() {
	if !w.stale {
		return
	}
	w.stale = false
	w.log.Info("remote datacenter's Consul answers again")
	if w.cfg.Stale != nil {
		w.cfg.Stale(false)
	}
}

// addrs turns catalog entries into the sorted peer set.
func (w *consulWatch) addrs(entries []*consulapi.ServiceEntry) []string {
	addrs := slices.Clone(w.cfg.Static)
	for _, e := range entries {
		if a := quicAddr(e); a != "" && !w.cfg.IsSelf(a) {
			addrs = append(addrs, a)
		} else if a == "" {
			w.log.Debug("ignoring an instance without a valid address and QUIC port", "id", serviceID(e))
		}
	}
	slices.Sort(addrs)
	return slices.Compact(addrs)
}

func serviceID(e *consulapi.ServiceEntry) string {
	if e.Service == nil {
		return ""
	}
	return e.Service.ID
}

// checkToken warns when the agent's token is unknown in the remote
// datacenter: Consul then runs the forwarded queries as the anonymous token,
// which answers an empty list rather than an error, so without this a
// datacenter-local token (what a Nomad workload identity's login makes) looks
// like a datacenter without kvcached.
func (w *consulWatch) checkToken(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, w.cfg.QueryTimeout)
	defer cancel()
	_, _, err := w.cfg.Client.ACL().TokenReadSelf((&consulapi.QueryOptions{Datacenter: w.cfg.Datacenter}).WithContext(ctx))
	// Any token may read itself: 403 means the datacenter does not know it
	// (Consul's "ACL not found").
	var se consulapi.StatusError
	if errors.As(err, &se) && se.Code == http.StatusForbidden {
		w.log.Warn("the Consul token is not valid in the remote datacenter (a local token?): its queries there see only what the anonymous token may read; give kvcached a global token", "error", err)
	}
}

func quicAddr(e *consulapi.ServiceEntry) string {
	if e.Service == nil {
		return ""
	}
	port, err := strconv.Atoi(e.Service.Meta[QUICPortMeta])
	if err != nil || port <= 0 || port > 65535 {
		return ""
	}
	host := e.Service.Address
	if host == "" && e.Node != nil {
		host = e.Node.Address
	}
	if !validHost(host) {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
}

// validHost accepts an IP address or a DNS name: registrations, remote
// datacenters' included, are not trusted to hold either.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if len(h) == 0 || len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return false
			}
		}
	}
	return true
}

// SelfMatcher reports whether a peer address is this node's own QUIC
// listener: the advertised address if given, else the listen address, and,
// when that is a wildcard (0.0.0.0, ::), the listen port on any of the
// host's interface addresses.
func SelfMatcher(advertise string, listen net.Addr) func(string) bool {
	self := map[string]bool{}
	if advertise != "" {
		self[advertise] = true
	}
	if ua, ok := listen.(*net.UDPAddr); ok {
		self[ua.String()] = true
		if advertise == "" && ua.IP.IsUnspecified() {
			if addrs, err := net.InterfaceAddrs(); err == nil {
				for _, a := range addrs {
					if ipn, ok := a.(*net.IPNet); ok {
						self[net.JoinHostPort(ipn.IP.String(), strconv.Itoa(ua.Port))] = true
					}
				}
			}
		}
	}
	return func(addr string) bool { return self[addr] }
}
