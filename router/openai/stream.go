package openai

import (
	"bytes"
	"encoding/json"
)

// preambleChunk is what a stream chunk must look like to carry no token.
type preambleChunk struct {
	Error   json.RawMessage `json:"error"`
	Choices []struct {
		Text         *string                    `json:"text"`
		Delta        map[string]json.RawMessage `json:"delta"`
		FinishReason *string                    `json:"finish_reason"`
	} `json:"choices"`
}

// IsPreamble reports whether the data of one server-sent event of a
// completion stream carries nothing the client sees yet: a chunk whose
// choices have only a role and empty content, as vLLM, SGLang and oasis-sim
// send before the prompt is scheduled. A token, a finish, an error, [DONE]
// and anything that is not such a chunk are not preamble.
func IsPreamble(data []byte) bool {
	if hasText(data, `"content":"`) || hasText(data, `"text":"`) {
		return false // a token: the common case, decided without decoding
	}
	var c preambleChunk
	if json.Unmarshal(bytes.TrimSpace(data), &c) != nil || len(c.Error) > 0 || len(c.Choices) == 0 {
		return false
	}
	for _, ch := range c.Choices {
		if ch.FinishReason != nil || ch.Text != nil && *ch.Text != "" {
			return false
		}
		for k, v := range ch.Delta {
			if k != "role" && !emptyJSON(v) {
				return false
			}
		}
	}
	return true
}

// hasText reports whether data has the member opener key (`"name":"`)
// followed by a non-empty string. Text inside a string value escapes its
// quotes, so a match is a member (of the delta, or of an object beside it,
// which then also carries text): a false match only calls a preamble
// content, which for a caller holding the stream back ends the hold early.
func hasText(data []byte, key string) bool {
	for {
		i := bytes.Index(data, []byte(key))
		if i < 0 {
			return false
		}
		data = data[i+len(key):]
		if len(data) > 0 && data[0] != '"' {
			return true
		}
	}
}

func emptyJSON(v json.RawMessage) bool {
	switch string(bytes.TrimSpace(v)) {
	case "null", `""`, "[]", "{}":
		return true
	}
	return false
}
