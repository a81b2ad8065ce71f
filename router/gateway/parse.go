package gateway

import (
	"encoding/json"
	"errors"
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
// fails when the body is not a JSON object or model is missing or not a
// string. Keys match exactly, as the Python engines match them (encoding/json
// struct decoding would also accept "Model").
func parseRequest(body []byte) (requestFields, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			return requestFields{}, errors.New("request body must be a JSON object")
		}
		return requestFields{}, errors.New("malformed JSON body: " + err.Error())
	}
	if top == nil {
		return requestFields{}, errors.New("request body must be a JSON object")
	}
	var f requestFields
	raw, ok := top["model"]
	if !ok || string(raw) == "null" {
		return f, errors.New("you must provide a model parameter")
	}
	if err := json.Unmarshal(raw, &f.Model); err != nil || f.Model == "" {
		return f, errors.New("model must be a non-empty string")
	}
	if raw, ok := top["stream"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &f.Stream); err != nil {
			return f, errors.New("stream must be a boolean")
		}
	}
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		var n int
		if raw, ok := top[k]; ok && json.Unmarshal(raw, &n) == nil && n >= 0 {
			f.MaxTokens, f.HasMaxTokens = n, true
			break
		}
	}
	if raw, ok := top["stream_options"]; ok {
		var so map[string]json.RawMessage
		var inc bool
		if json.Unmarshal(raw, &so) == nil && json.Unmarshal(so["include_usage"], &inc) == nil {
			f.IncludeUsage = inc
		}
	}
	return f, nil
}
