package app

import (
	"net"
	"net/netip"
	"strconv"
	"strings"
)

// isSelf reports whether an engine registration's address (host:port) is
// one of this router's own API listeners (-listen, -mesh-listen) or its
// -advertise address: proxying there would send every request back to the
// router (issue #33). A listener bound to 0.0.0.0 or :: matches any address
// of a local interface with its port; 0.0.0.0 and :: as a destination, and
// localhost, are loopback. Other host names are not resolved (the Via mark
// refuses the request that comes back instead). The pool calls it on every
// update, for each instance: only an instance on one of the listeners'
// ports costs more than a comparison (a look at the interfaces' addresses
// when a listener is bound to every address).
func (a *App) isSelf(address string) bool {
	host, portS, err := net.SplitHostPort(address)
	if err != nil {
		return false
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return false
	}
	if a.cfg.Advertise != "" && sameHostPort(a.cfg.Advertise, host, port) {
		return true
	}
	ip, ok := hostAddr(host)
	if !ok {
		return false
	}
	for _, ln := range []net.Listener{a.ln, a.meshLn} {
		if ln == nil {
			continue
		}
		ta, ok := ln.Addr().(*net.TCPAddr)
		if !ok || ta.Port != port {
			continue
		}
		bound, _ := netip.AddrFromSlice(ta.IP)
		bound = bound.Unmap()
		switch {
		case bound.IsUnspecified():
			// 0.0.0.0 takes IPv4 only; :: both (dual stack).
			if (ip.Is4() || bound.Is6()) && (ip.IsLoopback() || ip.IsUnspecified() || localAddress(ip)) {
				return true
			}
		case ip.IsUnspecified():
			// Connecting to 0.0.0.0 or :: reaches the host's loopback.
			if ip.Is4() && bound == netip.AddrFrom4([4]byte{127, 0, 0, 1}) || ip.Is6() && bound == netip.IPv6Loopback() {
				return true
			}
		case bound == ip:
			return true
		}
	}
	return false
}

// hostAddr is host as an IP address: a literal, or localhost as loopback.
func hostAddr(host string) (netip.Addr, bool) {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return netip.AddrFrom4([4]byte{127, 0, 0, 1}), true
	}
	ip, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap().WithZone(""), true
}

// sameHostPort reports whether hostport (the -advertise flag) names host and
// port, host names compared without case.
func sameHostPort(hostport, host string, port int) bool {
	h, p, err := net.SplitHostPort(hostport)
	if err != nil || p != strconv.Itoa(port) {
		return false
	}
	if x, ok := hostAddr(h); ok {
		y, ok := hostAddr(host)
		return ok && x == y
	}
	return strings.EqualFold(h, host)
}

// localAddress reports whether ip is an address of one of the host's
// interfaces (read now: addresses come and go).
func localAddress(ip netip.Addr) bool {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		var raw net.IP
		switch v := a.(type) {
		case *net.IPNet:
			raw = v.IP
		case *net.IPAddr:
			raw = v.IP
		}
		if x, ok := netip.AddrFromSlice(raw); ok && x.Unmap() == ip {
			return true
		}
	}
	return false
}
