package gateway

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
)

// Routing loops. An engine registration whose address is a router's (its
// own, by mistake or by a registrant's malice), or two routers registered as
// each other's engines, would make every request call the router again,
// each hop taking a connection and goroutines until nothing is left. The
// app refuses registrations naming this router's own listeners (discovery's
// WithSelf); the gateway marks every request it sends (to an engine, a
// hosted API, another datacenter's router) with a Via entry naming this
// process, and refuses a request that arrives with its own mark, or after
// MaxRouterHops routers, with 508 Loop Detected. The mark names a random
// per-process id: no address, nothing secret.

// MaxRouterHops is the most oasis-router Via entries a request may carry
// when it arrives: a federation hop between datacenters is one, routers in
// front of routers a few; a longer chain is a loop this router cannot see
// (routers that do not mark, or that strip Via).
const MaxRouterHops = 8

// viaPrefix starts every oasis-router Via entry's received-by.
const viaPrefix = "oasis-router-"

// hopMark is this gateway's Via entry, one slice per protocol version the
// request came in with (Via's received-protocol), shared by every upstream
// request that adds it to no other Via.
type hopMark struct {
	id     string   // "oasis-router-" and 16 hex digits
	http10 []string // "1.0 " + id
	http11 []string // "1.1 " + id
	http2  []string // "2 " + id
	http3  []string // "3 " + id (the federation listener)
}

func newHopMark() hopMark {
	var r [8]byte
	_, _ = rand.Read(r[:])
	id := viaPrefix + hex.EncodeToString(r[:])
	return hopMark{id: id, http10: []string{"1.0 " + id}, http11: []string{"1.1 " + id}, http2: []string{"2 " + id},
		http3: []string{"3 " + id}}
}

// entry is the mark for a request received over r's protocol.
func (h *hopMark) entry(r *http.Request) []string {
	switch {
	case r.ProtoMajor >= 3:
		return h.http3
	case r.ProtoMajor == 2:
		return h.http2
	case r.ProtoMinor == 0:
		return h.http10
	}
	return h.http11
}

// loop tells whether a request's Via fields show a loop: this router's own
// mark (own), or more oasis-router entries than MaxRouterHops.
func (h *hopMark) loop(via []string) (own bool, hops int) {
	for _, v := range via {
		if !strings.Contains(v, viaPrefix) {
			continue
		}
		if strings.Contains(v, h.id) {
			return true, 0
		}
		hops += strings.Count(v, viaPrefix)
	}
	return false, hops
}

// refuseLoop answers a request that came back to this router (or passed
// too many), true when it did.
func (g *Gateway) refuseLoop(w http.ResponseWriter, r *http.Request, rec *outcome) bool {
	via := r.Header["Via"]
	if len(via) == 0 {
		return false
	}
	own, hops := g.hop.loop(via)
	switch {
	case own:
		g.m.Loops.WithLabelValues("own_mark").Inc()
		g.log.Warn("refused a request that came back to this router: an engine registration (or another router's) points at it",
			"path", r.URL.Path, "via", strings.Join(via, ", "), "remote", r.RemoteAddr)
		rec.fail(w, http.StatusLoopDetected, "server_error", "loop_detected", "",
			"routing loop: this request already passed through this router ("+g.hop.id+
				"); an engine registration points back at a router", 0)
	case hops >= MaxRouterHops:
		g.m.Loops.WithLabelValues("hop_limit").Inc()
		g.log.Warn("refused a request that passed too many routers", "path", r.URL.Path, "hops", hops, "remote", r.RemoteAddr)
		rec.fail(w, http.StatusLoopDetected, "server_error", "loop_detected", "",
			"routing loop: this request already passed through "+strconv.Itoa(hops)+" oasis routers (at most "+
				strconv.Itoa(MaxRouterHops-1)+" before this one)", 0)
	default:
		return false
	}
	return true
}

// towardEngine returns the client's header fields to send upstream (an
// engine, a hosted API, another datacenter's router), sized for extra
// more: the end-to-end ones, less the router's own fields (X-Oasis-*: the
// deadline, the federation's; the router sets those it means to send) and
// the client's Authorization, which is the router's to check (an engine's
// or a hosted API's key is the router's to add). The value slices are
// shared: callers replace entries, never append to them.
func towardEngine(h http.Header, extra int) http.Header {
	out := make(http.Header, len(h)+extra)
	named := h["Connection"]
	for k, vs := range h {
		if isHopByHop(k) || k == "Authorization" || isOasisField(k) || connectionNames(named, k) {
			continue
		}
		out[k] = vs
	}
	return out
}

// isOasisField reports whether the field k is one of the router's own
// (X-Oasis-*, any case).
func isOasisField(k string) bool {
	const p = "X-Oasis-"
	return len(k) >= len(p) && strings.EqualFold(k[:len(p)], p)
}

// markHop adds this router's Via entry to up, after the entries the
// request came with.
func (g *Gateway) markHop(up, r *http.Request) {
	mine := g.hop.entry(r)
	if prev := up.Header["Via"]; len(prev) > 0 {
		up.Header["Via"] = append(prev[:len(prev):len(prev)], mine...)
		return
	}
	up.Header["Via"] = mine
}
