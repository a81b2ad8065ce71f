package peer

import (
	"context"
	"net"
	"slices"
	"strconv"
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
	// IsSelf reports whether a QUIC address is this node's own (see
	// SelfMatcher); nil counts none as its own.
	IsSelf func(addr string) bool
	// Static are peers kept in the set beside the catalog's.
	Static []string
	// Logger receives the watch's logs; nil discards them.
	Logger hclog.Logger
	// Set receives the peer set whenever it changes; required.
	Set func(addrs []string)
}

// WatchConsul follows the passing instances of cfg.Service in Consul's
// catalog with blocking queries and calls cfg.Set with their QUIC addresses
// (its own excluded, cfg.Static added) whenever the set changes, until ctx
// ends.
func WatchConsul(ctx context.Context, cfg ConsulConfig) {
	log, isSelf := cfg.Logger, cfg.IsSelf
	if log == nil {
		log = hclog.NewNullLogger()
	}
	if isSelf == nil {
		isSelf = func(string) bool { return false }
	}
	var index uint64
	var last []string
	backoff := time.Second
	for ctx.Err() == nil {
		q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx)
		entries, meta, err := cfg.Client.Health().Service(cfg.Service, "", true, q)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			log.Warn("listing kvcached peers in Consul", "error", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		if meta.LastIndex < index {
			index = 0 // the index went backwards: start over, as Consul advises
		} else {
			index = meta.LastIndex
		}
		addrs := slices.Clone(cfg.Static)
		for _, e := range entries {
			if a := quicAddr(e); a != "" && !isSelf(a) {
				addrs = append(addrs, a)
			}
		}
		slices.Sort(addrs)
		addrs = slices.Compact(addrs)
		if !slices.Equal(addrs, last) {
			log.Info("kvcached peer set changed", "peers", addrs)
			cfg.Set(addrs)
			last = addrs
		}
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
	if host == "" {
		return ""
	}
	return net.JoinHostPort(host, strconv.Itoa(port))
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
