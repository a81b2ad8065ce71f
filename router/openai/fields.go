package openai

import "encoding/json"

// WithFields returns body, a JSON object, with the members of set replaced
// (a nil value deletes the member). The other members keep their values;
// the object is encoded again (members in key order).
func WithFields(body []byte, set map[string]json.RawMessage) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	for k, v := range set {
		if v == nil {
			delete(m, k)
		} else {
			m[k] = v
		}
	}
	return json.Marshal(m)
}

// String is s as a JSON string.
func String(s string) json.RawMessage {
	b, _ := json.Marshal(s)
	return b
}

// AppendMember returns body, a valid JSON object, with the member key: val
// added after its last member; every other byte is kept. key is written as
// it is: a name that needs no escaping. A repeated key's
// last value wins (as in ParseRequest and Python's json), so the member
// appended overrides one already there.
func AppendMember(body []byte, key string, val json.RawMessage) []byte {
	end := len(body) - 1
	for end >= 0 && body[end] != '}' {
		end--
	}
	if end < 0 {
		return body
	}
	empty := skipWS(body, skipWS(body, 0)+1) == end
	out := make([]byte, 0, len(body)+len(key)+len(val)+4)
	out = append(out, body[:end]...)
	if !empty {
		out = append(out, ',')
	}
	out = append(out, '"')
	out = append(out, key...)
	out = append(out, '"')
	out = append(out, ':')
	out = append(out, val...)
	return append(out, body[end:]...)
}
