package gateway

import (
	"crypto/tls"
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// apiError is OpenAI's error object.
type apiError struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    *string `json:"code"`
}

// errorBody is OpenAI's error response: {"error": {...}}.
type errorBody struct {
	Error apiError `json:"error"`
}

// writeError sends {"error": {...}} with status. retryAfter > 0 adds a
// Retry-After header (whole seconds, at least 1).
func writeError(w http.ResponseWriter, status int, typ, code, param, msg string, retryAfter time.Duration) {
	e := apiError{Message: msg, Type: typ}
	if code != "" {
		e.Code = &code
	}
	if param != "" {
		e.Param = &param
	}
	body, _ := json.Marshal(errorBody{e})
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	if retryAfter > 0 {
		secs := int((retryAfter + time.Second - 1) / time.Second)
		h.Set("Retry-After", strconv.Itoa(max(1, secs)))
	}
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// RequirePeer serves h only to callers whose TLS connection check accepts,
// per request: the mesh listener's callers are authorized at their
// handshake, and again for each request so that a revoked intention also
// stops connections made before it (the check is cached per certificate).
// Others get 403 permission_denied.
func RequirePeer(h http.Handler, check func(tls.ConnectionState) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS == nil {
			writeError(w, http.StatusForbidden, "invalid_request_error", "permission_denied", "", "a mesh client certificate is required", 0)
			return
		}
		if err := check(*r.TLS); err != nil {
			writeError(w, http.StatusForbidden, "invalid_request_error", "permission_denied", "", "not allowed to call this service: "+err.Error(), 0)
			return
		}
		h.ServeHTTP(w, r)
	})
}
