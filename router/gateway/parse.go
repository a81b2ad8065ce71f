package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"strconv"
	"unicode/utf8"
)

// requestFields are the only body fields the router reads. The body itself is
// forwarded byte for byte.
type requestFields struct {
	Model        string
	Stream       bool
	MaxTokens    int
	HasMaxTokens bool
	IncludeUsage bool
}

// parseRequest extracts the routing fields from an OpenAI request body. It
// fails when the body is not valid JSON, not an object, or model is missing or
// not a non-empty string. Keys match exactly, as the Python engines match them
// (encoding/json struct decoding would also accept "Model"); a repeated key's
// last value wins, as in Python's json.
//
// It runs on every request, so instead of decoding the whole body into maps it
// validates once (json.Valid, no allocation) and then walks only the top-level
// keys, skipping values it does not need.
func parseRequest(body []byte) (requestFields, error) {
	var f requestFields
	if !json.Valid(body) {
		var v any
		err := json.Unmarshal(body, &v) // only to name the syntax error
		msg := "malformed JSON body"
		if err != nil {
			msg += ": " + err.Error()
		}
		return f, errors.New(msg)
	}
	var model, stream, maxTok, maxCompl, streamOpts []byte
	ok := topLevel(body, func(key, val []byte) {
		switch string(key) {
		case "model":
			model = val
		case "stream":
			stream = val
		case "max_tokens":
			maxTok = val
		case "max_completion_tokens":
			maxCompl = val
		case "stream_options":
			streamOpts = val
		}
	})
	if !ok {
		return f, errors.New("request body must be a JSON object")
	}
	if model == nil || string(model) == "null" {
		return f, errors.New("you must provide a model parameter")
	}
	if s, isStr := jsonString(model); !isStr || s == "" {
		return f, errors.New("model must be a non-empty string")
	} else {
		f.Model = s
	}
	switch string(stream) {
	case "", "null", "false":
	case "true":
		f.Stream = true
	default:
		return f, errors.New("stream must be a boolean")
	}
	for _, raw := range [][]byte{maxCompl, maxTok} {
		if len(raw) == 0 {
			continue // absent: Atoi would allocate its error
		}
		if n, err := strconv.Atoi(string(raw)); err == nil && n >= 0 {
			f.MaxTokens, f.HasMaxTokens = n, true
			break
		}
	}
	if len(streamOpts) > 0 && streamOpts[0] == '{' {
		topLevel(streamOpts, func(key, val []byte) {
			if string(key) == "include_usage" {
				f.IncludeUsage = string(val) == "true"
			}
		})
	}
	return f, nil
}

// topLevel calls fn with each key (unescaped) and raw value of the JSON object
// in b, which must be valid JSON. It reports false when b is not an object.
func topLevel(b []byte, fn func(key, val []byte)) bool {
	i := skipWS(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i++
	for {
		i = skipWS(b, i)
		if i >= len(b) || b[i] == '}' {
			return true
		}
		if b[i] == ',' {
			i = skipWS(b, i+1)
		}
		ks := i
		i = skipString(b, i)
		key := b[ks+1 : i-1]
		if bytes.IndexByte(key, '\\') >= 0 {
			s, _ := jsonString(b[ks:i])
			key = []byte(s)
		}
		i = skipWS(b, i)
		i = skipWS(b, i+1) // ':'
		vs := i
		i = skipValue(b, i)
		fn(key, b[vs:i])
	}
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

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the string token starting at b[i] == '"'.
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index after the (valid) JSON value starting at b[i].
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i = skipString(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	default: // number, true, false, null
		for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\t' && b[i] != '\n' && b[i] != '\r' {
			i++
		}
		return i
	}
}
