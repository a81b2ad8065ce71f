package gateway

// Usage for every stream (issue #36): a streaming generation request whose
// client did not ask for usage is sent with stream_options.include_usage,
// so the router counts its tokens, and the usage event the engine then
// ends with is taken out of the stream toward the client.

import (
	"bytes"
	"encoding/json"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// includeUsage is the stream_options member appended to a body without one.
var includeUsage = json.RawMessage(`{"include_usage":true}`)

// asksUsage reports whether x's body goes to engines with include_usage
// added (and its usage event is stripped toward the client).
func asksUsage(x *exchange) bool {
	return x.fields.Stream && !x.fields.IncludeUsage && generates(x.req.Path)
}

// forwardBody is the body x's attempts to wk send: the client's, asking
// for usage when asksUsage, and for token ids when the stream can be
// migrated (migrate.go).
func forwardBody(x *exchange, wk *scoring.Worker) []byte {
	body := x.body
	if asksUsage(x) {
		body = withUsage(body)
	}
	return withIDFields(x, wk, body)
}

// withUsage returns body asking for usage: stream_options appended when the
// body has none (every other byte kept), else merged into the client's.
func withUsage(body []byte) []byte {
	if !bytes.Contains(body, []byte(`"stream_options"`)) {
		return openai.AppendMember(body, "stream_options", includeUsage)
	}
	var top map[string]json.RawMessage
	if json.Unmarshal(body, &top) != nil {
		return body
	}
	opts := map[string]json.RawMessage{}
	_ = json.Unmarshal(top["stream_options"], &opts) // null or not an object: replaced
	opts["include_usage"] = json.RawMessage("true")
	v, err := json.Marshal(opts)
	if err != nil {
		return body
	}
	out, err := openai.WithFields(body, map[string]json.RawMessage{"stream_options": v})
	if err != nil {
		return body
	}
	return out
}

// stripUsage removes from data, in place, the usage events of the stream
// (an event whose choices are empty and whose usage is set) and returns
// what the client gets now. A line not ended yet is kept back (in
// rl.partial) until its end arrives, so an event split between reads is
// still recognised.
func (rl *relay) stripUsage(data []byte) []byte {
	if len(rl.partial) > 0 {
		// A fresh array: the new partial line must not overwrite what is returned.
		data = append(append([]byte(nil), rl.partial...), data...)
		rl.partial = nil
	}
	if rl.dropBlank {
		rl.dropBlank = false
		if data[0] == '\n' {
			data = data[1:] // the blank line of a usage event the last read ended
		}
	}
	if len(data) == 0 || !mentionsUsage(data) && data[len(data)-1] == '\n' {
		return data // fast path: whole lines, no usage
	}
	out := data[:0]
	for len(data) > 0 {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			rl.partial = append(rl.partial[:0], data...)
			break
		}
		line := data[:i+1]
		data = data[i+1:]
		if isUsageEvent(line) {
			if len(data) == 0 {
				rl.dropBlank = true // in the next read
			} else if data[0] == '\n' {
				data = data[1:] // the event's blank line
			}
			continue
		}
		out = append(out, line...) // never ahead of the read position
	}
	return out
}

// isUsageEvent reports whether an SSE line is the data of a usage-only
// event: empty choices and a usage object.
func isUsageEvent(line []byte) bool {
	d, ok := bytes.CutPrefix(line, []byte("data:"))
	return ok && mentionsUsage(d) && bytes.Contains(d, []byte(`"choices":[]`)) &&
		!bytes.Contains(d, []byte(`"usage":null`))
}
