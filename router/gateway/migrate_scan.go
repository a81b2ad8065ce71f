package gateway

import "bytes"

// scanChunk fills c from a streamed event without a full JSON decode, for
// the common shape: no escapes, at most one choice, no tool calls or
// reasoning. It reports false for anything else (the caller decodes the
// event with encoding/json). c's slices are reused; its raw values point
// into data.
func scanChunk(data []byte, c *streamChunk) bool {
	if bytes.IndexByte(data, '\\') >= 0 || bytes.Count(data, []byte(`"index":`)) > 1 ||
		bytes.Contains(data, []byte(`"tool_calls":`)) || bytes.Contains(data, []byte(`"reasoning`)) {
		return false
	}
	var ok bool
	if c.ID, ok = rawMember(data, `"id":`); !ok {
		return false
	}
	c.Created, _ = rawMember(data, `"created":`)
	c.Usage, _ = rawMember(data, `"usage":`)
	c.PromptTokenIDs, ok = intsMember(data, `"prompt_token_ids":`, c.PromptTokenIDs[:0])
	if !ok {
		return false
	}
	if !bytes.Contains(data, []byte(`"index":`)) {
		c.Choices = c.Choices[:0]
		return true
	}
	if cap(c.Choices) == 0 {
		c.Choices = make([]streamChoice, 1)
	}
	c.Choices = c.Choices[:1]
	ch := &c.Choices[0]
	if idx, _ := rawMember(data, `"index":`); string(idx) != "0" {
		return false
	}
	ids, ok := intsMember(data, `"token_ids":`, ch.TokenIDs[:0])
	if !ok {
		return false
	}
	ch.TokenIDs, ch.PromptTokenIDs = ids, nil // a completion's prompt ids are in c.PromptTokenIDs
	ch.Output = ch.Output[:0]
	for _, k := range []string{`"text":`, `"content":`} {
		if v, ok := rawMember(data, k); ok && len(v) >= 2 && v[0] == '"' {
			ch.Output = append(ch.Output, v[1:len(v)-1]...)
		}
	}
	ch.Delta.Role = ""
	if _, ok := rawMember(data, `"role":`); ok {
		ch.Delta.Role = "assistant"
	}
	ch.FinishReason = nil
	if v, ok := rawMember(data, `"finish_reason":`); ok && string(v) != "null" {
		ch.FinishReason = &finishSeen
	}
	return true
}

// finishSeen marks a scanned choice's finish reason (only its presence is read).
var finishSeen = "finish"

// rawMember returns the raw value of the first member named key (with its
// quotes and colon, e.g. `"id":`) in data, which has no escapes; not ok
// when absent or null-free parsing fails.
func rawMember(data []byte, key string) ([]byte, bool) {
	i := bytes.Index(data, []byte(key))
	if i < 0 {
		return nil, false
	}
	v := data[i+len(key):]
	for len(v) > 0 && v[0] == ' ' {
		v = v[1:]
	}
	end := valueEnd(v)
	if end <= 0 {
		return nil, false
	}
	return v[:end], true
}

// valueEnd is the length of the JSON value at the start of v (its strings
// may hold escapes), 0 when it does not end in v.
func valueEnd(v []byte) int {
	depth, inString := 0, false
	for i := 0; i < len(v); i++ {
		switch b := v[i]; {
		case inString && b == '\\':
			i++ // the escaped byte
		case inString:
			if b == '"' {
				inString = false
				if depth == 0 {
					return i + 1
				}
			}
		case b == '"':
			inString = true
		case b == '{' || b == '[':
			depth++
		case b == '}' || b == ']':
			if depth == 0 {
				return i // a scalar ended by its container
			}
			if depth--; depth == 0 {
				return i + 1
			}
		case b == ',' && depth == 0:
			return i
		}
	}
	return 0
}

// intsMember appends the integers of the array member key to dst: absent
// or null leaves dst empty; not ok when the value is not an integer array.
func intsMember(data []byte, key string, dst []int32) ([]int32, bool) {
	v, ok := rawMember(data, key)
	if !ok || string(v) == "null" {
		return dst, true
	}
	if len(v) < 2 || v[0] != '[' || v[len(v)-1] != ']' {
		return dst, false
	}
	n, digits, neg := int64(0), 0, false
	for _, b := range v[1:] {
		switch {
		case b >= '0' && b <= '9':
			n, digits = n*10+int64(b-'0'), digits+1
			if n > 1<<31 {
				return dst, false
			}
		case b == '-' && digits == 0:
			neg = true
		case b == ',' || b == ']':
			if digits == 0 {
				return dst, b == ']' && len(dst) == 0
			}
			if neg {
				n = -n
			}
			dst = append(dst, int32(n))
			n, digits, neg = 0, 0, false
		case b == ' ':
		default:
			return dst, false
		}
	}
	return dst, true
}
