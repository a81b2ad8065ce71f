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
