package openai

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// rawFields are the raw JSON values of the top-level members ParseRequest
// reads (nil when absent).
type rawFields struct {
	model, stream, maxTok, maxCompl, streamOpts []byte
	messages, prompt, addGenPrompt, addSpecial  []byte
	routerOwned                                 bool // a member RouterOwned names
}

// maxJSONDepth is encoding/json's nesting limit, which scanRequest keeps so
// that it accepts exactly what json.Valid accepts.
const maxJSONDepth = 10000

// scanRequest validates b as JSON and reports whether it is an object; for
// an object it fills raw from its top-level members (the last of a repeated
// key wins). raw is only meaningful when both results are true.
func scanRequest(b []byte, raw *rawFields) (valid, object bool) {
	i := skipWS(b, 0)
	if i >= len(b) {
		return false, false
	}
	if b[i] != '{' {
		end, ok := scanValue(b, i, 0)
		return ok && skipWS(b, end) == len(b), false
	}
	end, ok := scanMembers(b, i, 1, func(key, val []byte) {
		switch string(key) {
		case "model":
			raw.model = val
		case "stream":
			raw.stream = val
		case "max_tokens":
			raw.maxTok = val
		case "max_completion_tokens":
			raw.maxCompl = val
		case "stream_options":
			raw.streamOpts = val
		case "messages":
			raw.messages = val
		case "prompt":
			raw.prompt = val
		case "add_generation_prompt":
			raw.addGenPrompt = val
		case "add_special_tokens":
			raw.addSpecial = val
		case keyKVTransferParams, keyBootstrapHost, keyBootstrapPort, keyBootstrapRoom,
			keyBootstrapPairKey, keyPrefillDPRank, keyDecodeTPSize:
			raw.routerOwned = true
		}
	})
	return ok && skipWS(b, end) == len(b), true
}

// scanMembers validates the JSON object whose '{' is b[i], depth being the
// nesting of its members' values (the object included), and returns the
// index after its '}'. With fn it calls fn with each member's key
// (unescaped) and raw value, in order: one walk both checks a body and finds
// the fields the router reads.
func scanMembers(b []byte, i, depth int, fn func(key, val []byte)) (int, bool) {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, false
		}
		ks := i
		var ok bool
		if i, ok = scanString(b, i); !ok {
			return i, false
		}
		ke := i
		i = skipWS(b, i)
		if i >= len(b) || b[i] != ':' {
			return i, false
		}
		vs := skipWS(b, i+1)
		if i, ok = scanValue(b, vs, depth); !ok {
			return i, false
		}
		if fn != nil {
			key := b[ks+1 : ke-1]
			if bytes.IndexByte(key, '\\') >= 0 {
				s, _ := jsonString(b[ks:ke])
				key = []byte(s)
			}
			fn(key, b[vs:i])
		}
		var more bool
		if i, more, ok = afterElement(b, i, '}'); !ok || !more {
			return i, ok
		}
	}
}

// afterElement reads what follows an object's member or an array's element:
// a ',' (more to come; i after it and the spaces after that) or closer (the
// end; i after it).
func afterElement(b []byte, i int, closer byte) (next int, more, ok bool) {
	i = skipWS(b, i)
	if i < len(b) {
		switch b[i] {
		case ',':
			return skipWS(b, i+1), true, true
		case closer:
			return i + 1, false, true
		}
	}
	return i, false, false
}

// scanValue validates the JSON value starting at b[i], inside depth
// enclosing arrays and objects, and returns the index after it.
func scanValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		return scanString(b, i)
	case c == '{':
		if depth++; depth > maxJSONDepth {
			return i, false
		}
		return scanMembers(b, i, depth, nil)
	case c == '[':
		if depth++; depth > maxJSONDepth {
			return i, false
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok, more bool
			if i, ok = scanValue(b, i, depth); !ok {
				return i, false
			}
			if i, more, ok = afterElement(b, i, ']'); !ok || !more {
				return i, ok
			}
		}
	case c == 't':
		return scanLiteral(b, i, "true")
	case c == 'f':
		return scanLiteral(b, i, "false")
	case c == 'n':
		return scanLiteral(b, i, "null")
	case c == '-' || '0' <= c && c <= '9':
		return scanNumber(b, i)
	}
	return i, false
}

func scanLiteral(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

// scanString validates the string token at b[i] == '"' as encoding/json
// does (escapes checked, control characters refused, bytes otherwise
// unchecked) and returns the index after it.
func scanString(b []byte, i int) (int, bool) {
	for i++; i < len(b); i++ {
		c := b[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		switch c {
		case '"':
			return i + 1, true
		case '\\':
			i++
			if i >= len(b) {
				return i, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				if len(b)-i <= 4 {
					return i, false
				}
				for _, h := range b[i+1 : i+5] {
					if !isHex(h) {
						return i, false
					}
				}
				i += 4
			default:
				return i, false
			}
		default: // a control character
			return i, false
		}
	}
	return i, false
}

// scanNumber validates the number at b[i] (JSON's grammar:
// -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?) and returns the index after it.
func scanNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && '1' <= b[i] && b[i] <= '9':
		i = digits(b, i+1)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && '0' <= b[i] && b[i] <= '9' {
		i++
	}
	return i
}

// jsonString decodes a JSON string token.
func jsonString(tok []byte) (string, bool) {
	if len(tok) < 2 || tok[0] != '"' {
		return "", false
	}
	inner := tok[1 : len(tok)-1]
	if bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
		return string(inner), true
	}
	var s string
	if err := json.Unmarshal(tok, &s); err != nil {
		return "", false
	}
	return s, true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
