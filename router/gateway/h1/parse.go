package h1

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"net/url"
	"strings"
)

// head is a parsed request line and header block.
type head struct {
	method         string
	target         string // request-target as sent (http.Request.RequestURI)
	url            *url.URL
	major, minor   int
	header         http.Header
	host           string
	contentLength  int64 // -1 with chunked
	chunked        bool
	close          bool // the client asked to close after this request (or HTTP/1.0)
	expectContinue bool

	u    url.URL    // url, when the target is a plain path
	vals [12]string // backing array of single-valued header fields
}

// protoError is a request the server answers itself with status.
type protoError struct {
	status int
	msg    string
}

func (e *protoError) Error() string { return e.msg }

func badRequest(msg string) *protoError { return &protoError{http.StatusBadRequest, msg} }

// errTooLarge marks a header block over the limit.
var errTooLarge = &protoError{http.StatusRequestHeaderFieldsTooLarge, "request header too large"}

// readHead reads one request head from br, at most max bytes of request line
// and headers. It is strict where net/http is lenient in ways that matter for
// request smuggling (obs-folded lines, both Content-Length and
// Transfer-Encoding, any transfer coding but chunked): such requests get 400
// or 501. A read error is returned as is (nil *protoError).
func readHead(br *bufio.Reader, max int) (*head, *protoError, error) {
	h := &head{}
	if perr, err := readHeadInto(br, max, h); perr != nil || err != nil {
		return nil, perr, err
	}
	return h, nil, nil
}

// readHeadInto is readHead filling in h, a zero head (one allocation with
// the rest of the request's state).
func readHeadInto(br *bufio.Reader, max int, h *head) (*protoError, error) {
	budget := max
	line, err := readLine(br, &budget)
	if err != nil {
		return asProto(err)
	}
	method, rest, ok1 := bytes.Cut(line, []byte{' '})
	target, proto, ok2 := bytes.Cut(rest, []byte{' '})
	if !ok1 || !ok2 || len(method) == 0 || len(target) == 0 {
		return badRequest("malformed request line"), nil
	}
	if !IsToken(method) {
		return badRequest("invalid method"), nil
	}
	h.method = internMethod(method)
	switch string(proto) {
	case "HTTP/1.1":
		h.major, h.minor = 1, 1
	case "HTTP/1.0":
		h.major, h.minor = 1, 0
		h.close = true
	default:
		if len(proto) == 8 && bytes.HasPrefix(proto, []byte("HTTP/")) && isDigit(proto[5]) && proto[6] == '.' && isDigit(proto[7]) {
			return &protoError{http.StatusHTTPVersionNotSupported, "unsupported protocol version"}, nil
		}
		return badRequest("malformed HTTP version"), nil
	}
	for _, c := range target {
		if c <= ' ' || c == 0x7f {
			return badRequest("invalid request target"), nil
		}
	}
	h.target = internTarget(target)
	if plainPath(h.target) {
		h.u.Path = h.target
		h.url = &h.u
	} else {
		if h.method == http.MethodConnect && h.target[0] != '/' {
			return &protoError{http.StatusMethodNotAllowed, "CONNECT is not supported"}, nil
		}
		if h.url, err = url.ParseRequestURI(h.target); err != nil {
			return badRequest("invalid request target"), nil
		}
	}

	h.header = make(http.Header, 8)
	// One backing array for the common case of a single value per header.
	vals := h.vals[:0]
	var hosts, lengths int
	for {
		line, err := readLine(br, &budget)
		if err != nil {
			return asProto(err)
		}
		if len(line) == 0 {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			return badRequest("folded header lines are not accepted"), nil
		}
		k, v, ok := bytes.Cut(line, []byte{':'})
		if !ok || !IsToken(k) {
			return badRequest("malformed header line"), nil
		}
		v = TrimOWS(v)
		if !ValidValue(v) {
			return badRequest("invalid header value"), nil
		}
		key := CanonicalKey(k)
		vs := internValue(v)
		switch key {
		case "Host":
			hosts++
			if !validHost(vs) {
				return badRequest("malformed Host header"), nil
			}
			h.host = vs
			continue // net/http keeps Host out of the header map too
		case "Content-Length":
			lengths++
			n, ok := parseLength(vs)
			if !ok || lengths > 1 && n != h.contentLength {
				return badRequest("bad Content-Length"), nil
			}
			h.contentLength = n
		case "Transfer-Encoding":
			if h.chunked || !strings.EqualFold(vs, "chunked") {
				return &protoError{http.StatusNotImplemented, "unsupported transfer encoding"}, nil
			}
			h.chunked = true
		case "Connection":
			for _, tok := range strings.Split(vs, ",") {
				tok = strings.TrimSpace(tok)
				switch {
				case strings.EqualFold(tok, "close"):
					h.close = true
				case strings.EqualFold(tok, "keep-alive") && h.minor == 0:
					// HTTP/1.0 keep-alive is not offered: one request per connection.
				}
			}
		case "Expect":
			if !strings.EqualFold(vs, "100-continue") {
				return &protoError{http.StatusExpectationFailed, "unsupported Expect"}, nil
			}
			h.expectContinue = h.minor == 1
		}
		AddValue(h.header, &vals, key, vs)
	}
	if h.chunked {
		if lengths > 0 || h.minor == 0 {
			return badRequest("Transfer-Encoding with Content-Length or in HTTP/1.0"), nil
		}
		h.contentLength = -1
	}
	if h.url.Host != "" {
		h.host = h.url.Host // absolute-form target
	} else if h.minor == 1 && hosts != 1 {
		return badRequest("missing or repeated Host header"), nil
	}
	if hosts > 1 {
		return badRequest("repeated Host header"), nil
	}
	return nil, nil
}

func asProto(err error) (*protoError, error) {
	var pe *protoError
	if errors.As(err, &pe) {
		return pe, nil
	}
	return nil, err
}

// readLine returns one line without its CRLF (or LF), charging its length
// to budget. The slice is valid until the next read from br.
func readLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		// Longer than the buffer: collect the pieces.
		full := append([]byte(nil), line...)
		for err == bufio.ErrBufferFull {
			if len(full) > *budget {
				return nil, errTooLarge
			}
			line, err = br.ReadSlice('\n')
			full = append(full, line...)
		}
		line = full
	}
	if len(line) > *budget {
		return nil, errTooLarge
	}
	*budget -= len(line)
	if err != nil {
		return nil, err
	}
	line = line[:len(line)-1]
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	return line, nil
}

// plainPath reports whether t is an origin-form target made only of
// characters url.ParseRequestURI keeps as they are: its URL is just the path.
func plainPath(t string) bool {
	if t[0] != '/' || strings.HasPrefix(t, "//") {
		return false
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '/' || c == '-' || c == '_' || c == '.' || c == '~') {
			return false
		}
	}
	return true
}

// internTarget returns t as a string, without allocating for the router's
// own API paths.
func internTarget(t []byte) string {
	switch string(t) {
	case "/v1/chat/completions":
		return "/v1/chat/completions"
	case "/v1/completions":
		return "/v1/completions"
	case "/v1/embeddings":
		return "/v1/embeddings"
	case "/v1/models":
		return "/v1/models"
	case "/health":
		return "/health"
	case "/ready":
		return "/ready"
	case "/metrics":
		return "/metrics"
	}
	return string(t)
}

func internMethod(m []byte) string {
	switch string(m) {
	case "POST":
		return http.MethodPost
	case "GET":
		return http.MethodGet
	case "HEAD":
		return http.MethodHead
	}
	return string(m)
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// validHost accepts what net/http's Host check accepts, minus nothing.
func validHost(h string) bool {
	for i := 0; i < len(h); i++ {
		c := h[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			strings.IndexByte("!$%&'()*+,-.:;=[]_~", c) >= 0) {
			return false
		}
	}
	return true
}

// parseLength parses a Content-Length: digits only, no sign, no overflow.
func parseLength(s string) (int64, bool) {
	if s == "" || len(s) > 18 {
		return 0, false
	}
	var n int64
	for i := 0; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, false
		}
		n = n*10 + int64(s[i]-'0')
	}
	return n, true
}
