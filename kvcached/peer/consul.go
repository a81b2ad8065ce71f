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

// WatchConsul follows the passing instances of service in Consul's catalog
// with blocking queries and calls set with their QUIC addresses (those for
// which isSelf is true excluded, plus static) whenever the set changes, until
// ctx ends.
func WatchConsul(ctx context.Context, client *consulapi.Client, service string, isSelf func(string) bool, static []string, log hclog.Logger, set func([]string)) {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	var index uint64
	var last []string
	backoff := time.Second
	for ctx.Err() == nil {
		q := (&consulapi.QueryOptions{WaitIndex: index, WaitTime: 5 * time.Minute}).WithContext(ctx)
		entries, meta, err := client.Health().Service(service, "", true, q)
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
		addrs := slices.Clone(static)
		for _, e := range entries {
			if a := quicAddr(e); a != "" && !isSelf(a) {
				addrs = append(addrs, a)
			}
		}
		slices.Sort(addrs)
		addrs = slices.Compact(addrs)
		if !slices.Equal(addrs, last) {
			log.Info("kvcached peer set changed", "peers", addrs)
			set(addrs)
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
