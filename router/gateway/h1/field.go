package h1

import (
	"bytes"
	"net/http"
	"net/textproto"
)

// Header-field syntax (RFC 9110 §5), shared by this package's request
// parser and response writer and by the gateway's client for engines.

// IsToken reports whether b is an RFC 9110 token, what a field name or a
// method must be.
func IsToken[T string | []byte](b T) bool {
	if len(b) == 0 {
		return false
	}
	for i := 0; i < len(b); i++ {
		if !isTokenChar(b[i]) {
			return false
		}
	}
	return true
}

// tchar bitmaps: bit c of tcharLo (c < 64) or of tcharHi (64 ≤ c < 128) is
// set when c is an RFC 9110 tchar ("!#$%&'*+-.^_`|~", digits, letters).
const (
	tcharLo uint64 = 0x03ff6cfa00000000
	tcharHi uint64 = 0x57ffffffc7fffffe
)

// isTokenChar reports whether c is an RFC 9110 tchar: a bit test, where a
// switch over the delimiters compiled to a chain of compares per byte
// (this runs for every field name read or written).
func isTokenChar(c byte) bool {
	if c < 64 {
		return tcharLo>>c&1 != 0
	}
	return c < 128 && tcharHi>>(c-64)&1 != 0
}

// ValidValue reports whether a received field value holds no control
// character but tab.
func ValidValue(v []byte) bool {
	for _, c := range v {
		if c < ' ' && c != '\t' || c == 0x7f {
			return false
		}
	}
	return true
}

// SafeToWrite reports whether v can be written as a field value (or request
// line part) without ending the line early: no CR, LF or NUL.
func SafeToWrite(v string) bool {
	// A byte loop: strings.ContainsAny builds a set on every call, and
	// this runs for every header value written.
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '\r' || c == '\n' || c == 0 {
			return false
		}
	}
	return true
}

// LinesSafe reports whether b, header lines built by appending "name: value"
// and CRLF lines times, holds exactly that many CRs and LFs and no NUL: no
// name or value had a byte that would end its line early. SafeToWrite for a
// whole block at once (vectorised counts, where a byte loop per value cost
// more than building the lines).
func LinesSafe(b []byte, lines int) bool {
	return bytes.Count(b, []byte{'\n'}) == lines && bytes.Count(b, []byte{'\r'}) == lines && bytes.IndexByte(b, 0) < 0
}

// internValue returns v as a string, without allocating for field values
// the router's clients and engines commonly send.
func internValue(v []byte) string {
	switch string(v) {
	case "application/json":
		return "application/json"
	case "text/event-stream":
		return "text/event-stream"
	case "gzip":
		return "gzip"
	case "Go-http-client/1.1":
		return "Go-http-client/1.1"
	case "*/*":
		return "*/*"
	case "keep-alive":
		return "keep-alive"
	case "close":
		return "close"
	case "chunked":
		return "chunked"
	case "no-cache":
		return "no-cache"
	}
	return string(v)
}

// TrimOWS trims spaces and tabs around a field value (bytes.Trim builds its
// cutset on every call).
func TrimOWS(v []byte) []byte {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// CanonicalKey canonicalises a field name, without allocating for the usual
// request and response headers.
func CanonicalKey(k []byte) string {
	switch string(k) {
	case "Host", "host":
		return "Host"
	case "Content-Type", "content-type":
		return "Content-Type"
	case "Content-Length", "content-length":
		return "Content-Length"
	case "User-Agent", "user-agent":
		return "User-Agent"
	case "Accept", "accept":
		return "Accept"
	case "Accept-Encoding", "accept-encoding":
		return "Accept-Encoding"
	case "Authorization", "authorization":
		return "Authorization"
	case "Connection", "connection":
		return "Connection"
	case "Transfer-Encoding", "transfer-encoding":
		return "Transfer-Encoding"
	case "Expect", "expect":
		return "Expect"
	case "X-Request-Id", "x-request-id":
		return "X-Request-Id"
	case "X-Oasis-Deadline-Ms", "x-oasis-deadline-ms":
		return "X-Oasis-Deadline-Ms"
	case "Openai-Organization", "openai-organization":
		return "Openai-Organization"
	case "Cache-Control", "cache-control":
		return "Cache-Control"
	case "Date", "date":
		return "Date"
	case "Server", "server":
		return "Server"
	}
	return textproto.CanonicalMIMEHeaderKey(string(k))
}

// AddValue appends v to h[key]. A key's first value is carved from *vals, one
// backing array for the usual single-valued headers of a message.
func AddValue(h http.Header, vals *[]string, key, v string) {
	if cur, ok := h[key]; ok {
		h[key] = append(cur, v)
		return
	}
	*vals = append(*vals, v)
	n := len(*vals)
	h[key] = (*vals)[n-1 : n : n]
}
