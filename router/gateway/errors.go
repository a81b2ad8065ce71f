package gateway

import (
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
	body, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{e})
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

// WriteProtocolError answers a request the HTTP server rejected before the
// gateway saw it (malformed request line or headers, header block too large,
// unsupported transfer coding), in OpenAI's error shape like every other
// error (h1.Server.ProtocolError).
func WriteProtocolError(w http.ResponseWriter, status int, msg string) {
	writeError(w, status, "invalid_request_error", "bad_request", "", msg, 0)
}
