package gateway

import (
	"net/http"
	"slices"
	"strings"
)

// CORS lets browser pages of the listed origins call the router
// (Config.CORS; off when nil).
type CORS struct {
	Origins []string // allowed origins (scheme://host[:port]), or "*" for any
	Methods []string // allowed methods (default GET, POST)
	Headers []string // allowed request headers, or "*" for those asked (default DefaultCORSHeaders)
}

// Default CORS methods and headers. The headers are the API's, and those
// the official OpenAI SDKs send on every request (OpenAI-*, X-Stainless-*):
// without them a browser refuses the SDK's preflight.
var (
	DefaultCORSMethods = []string{http.MethodGet, http.MethodPost}
	DefaultCORSHeaders = []string{"Authorization", "Content-Type", "X-Request-Id",
		"OpenAI-Organization", "OpenAI-Project", "OpenAI-Beta",
		"X-Stainless-Arch", "X-Stainless-Lang", "X-Stainless-OS", "X-Stainless-Package-Version",
		"X-Stainless-Retry-Count", "X-Stainless-Runtime", "X-Stainless-Runtime-Version", "X-Stainless-Timeout",
		"X-Stainless-Helper-Method", "X-Stainless-Poll-Helper", "X-Stainless-Custom-Poll-Interval"}
)

// allowOrigin returns the Access-Control-Allow-Origin value for origin, ""
// when it is not allowed.
func (c *CORS) allowOrigin(origin string) string {
	for _, o := range c.Origins {
		if o == "*" {
			return "*"
		}
		if strings.EqualFold(o, origin) {
			return origin
		}
	}
	return ""
}

// cors answers preflight requests and marks answers to allowed origins;
// it reports whether the request was answered.
func (g *Gateway) cors(w http.ResponseWriter, r *http.Request) bool {
	c := g.cfg.CORS
	origin := r.Header.Get("Origin")
	if c == nil || origin == "" {
		return false
	}
	h := w.Header()
	h.Add("Vary", "Origin")
	allow := c.allowOrigin(origin)
	preflight := r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != ""
	if allow == "" {
		if preflight {
			writeError(w, http.StatusForbidden, "invalid_request_error", "cors_origin_not_allowed", "",
				"origin "+origin+" is not allowed", 0)
		}
		return preflight
	}
	h.Set("Access-Control-Allow-Origin", allow)
	if !preflight {
		h.Set("Access-Control-Expose-Headers", "X-Request-Id, Retry-After")
		return false
	}
	methods := c.Methods
	if len(methods) == 0 {
		methods = DefaultCORSMethods
	}
	headers := strings.Join(c.Headers, ", ")
	if len(c.Headers) == 0 {
		headers = strings.Join(DefaultCORSHeaders, ", ")
	} else if slices.Contains(c.Headers, "*") {
		headers = r.Header.Get("Access-Control-Request-Headers")
	}
	h.Set("Access-Control-Allow-Methods", strings.Join(methods, ", "))
	if headers != "" {
		h.Set("Access-Control-Allow-Headers", headers)
	}
	h.Set("Access-Control-Max-Age", "600")
	w.WriteHeader(http.StatusNoContent)
	return true
}
