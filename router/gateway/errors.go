package gateway

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
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

// Bounds on an engine's error answer: what is read of it, and of its
// message what the client gets.
const (
	maxEngineErrorBody = 64 << 10
	maxErrorMessage    = 4 << 10
)

// engineError answers the client with an engine's 4xx/5xx answer in
// OpenAI's error shape, its status kept: the engine's message, type, param
// and code where it gave them (vLLM's and llama.cpp's JSON, a numeric code
// as the status's name), else its body (plain text, FastAPI's detail) as
// the message. At most maxEngineErrorBody bytes are read.
func (g *Gateway) engineError(c *call, resp *http.Response) {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxEngineErrorBody))
	e := asAPIError(resp.StatusCode, b)
	h := c.w.Header()
	if ra := resp.Header.Get("Retry-After"); ra != "" {
		h.Set("Retry-After", ra)
	}
	h.Set("X-Request-Id", c.x.reqID)
	c.rec.status = resp.StatusCode
	c.rec.firstByte(time.Now())
	code, param := "", ""
	if e.Code != nil {
		code = *e.Code
	}
	if e.Param != nil {
		param = *e.Param
	}
	writeError(c.w, resp.StatusCode, e.Type, code, param, e.Message, 0)
}

// asAPIError reads an engine's error body b, sent with status, as OpenAI's
// error object.
func asAPIError(status int, b []byte) apiError {
	var v struct {
		Error   json.RawMessage `json:"error"`
		Message json.RawMessage `json:"message"` // vLLM's older top-level shape
		Type    json.RawMessage `json:"type"`
		Param   json.RawMessage `json:"param"`
		Code    json.RawMessage `json:"code"`
		Detail  json.RawMessage `json:"detail"` // FastAPI's
	}
	e := apiError{}
	if json.Unmarshal(b, &v) == nil {
		if len(v.Error) > 0 && v.Error[0] == '{' {
			_ = json.Unmarshal(v.Error, &v)
		} else if len(v.Error) > 0 && v.Message == nil {
			v.Message = v.Error // {"error": "text"}
		}
		e.Message = jsonText(v.Message)
		if e.Message == "" {
			e.Message = jsonText(v.Detail)
		}
		e.Type, _ = jsonStr(v.Type)
		if p, ok := jsonStr(v.Param); ok && p != "" {
			e.Param = &p
		}
		if c, ok := jsonStr(v.Code); ok && c != "" {
			e.Code = &c
		}
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(strings.ToValidUTF8(string(b), "\uFFFD"))
	}
	if e.Message == "" {
		e.Message = "the engine answered " + strconv.Itoa(status) + " " + http.StatusText(status)
	}
	if len(e.Message) > maxErrorMessage {
		e.Message = strings.ToValidUTF8(e.Message[:maxErrorMessage], "") + "…"
	}
	if e.Type == "" {
		e.Type = "invalid_request_error"
		if status >= 500 {
			e.Type = "server_error"
		}
	}
	if e.Code == nil {
		c := strings.ToLower(strings.ReplaceAll(http.StatusText(status), " ", "_"))
		if c == "" {
			c = "engine_error"
		}
		e.Code = &c
	}
	return e
}

// jsonStr is raw as a string when it is a JSON string.
func jsonStr(raw json.RawMessage) (string, bool) {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// jsonText is raw as a string, or its JSON text when it is another value
// (FastAPI's detail list), "" when absent or null.
func jsonText(raw json.RawMessage) string {
	if s, ok := jsonStr(raw); ok {
		return s
	}
	if len(raw) == 0 || string(raw) == "null" {
		return ""
	}
	return string(raw)
}
