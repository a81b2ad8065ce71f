package gateway

import (
	"net/http"
	"net/textproto"
	"strings"
)

// copyEndToEnd sets dst's fields from src's end-to-end ones.
func copyEndToEnd(dst, src http.Header) {
	named := src["Connection"]
	for k, vs := range src {
		if isHopByHop(k) || connectionNames(named, k) {
			continue
		}
		dst[k] = vs
	}
}

// isHopByHop reports whether the canonical field k is one of the
// connection-level fields a proxy never forwards (RFC 9110 §7.6.1), besides
// those a message's Connection field names.
func isHopByHop(k string) bool {
	switch k {
	case "Connection", "Keep-Alive", "Proxy-Connection", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// connectionNames reports whether the Connection field values named list
// the canonical field k, which then applies to this connection only.
func connectionNames(named []string, k string) bool {
	for _, v := range named {
		for _, f := range strings.Split(v, ",") {
			if f = textproto.TrimString(f); f != "" && http.CanonicalHeaderKey(f) == k {
				return true
			}
		}
	}
	return false
}
