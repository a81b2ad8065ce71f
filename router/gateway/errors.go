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
