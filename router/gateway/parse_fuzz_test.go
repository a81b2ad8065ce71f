package gateway

import (
	"encoding/json"
	"testing"
)

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"model":"m","prompt":"x","max_tokens":16,"stream_options":{"include_usage":true}}`,
		`{"model":1}`, `[]`, `null`, `{"model":"m","stream":"yes"}`, `{`, ``, `{"model":"\u0000"}`,
		`{"model":"m","max_completion_tokens":-1,"tools":[{"type":"function"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := parseRequest(body)
		if err != nil {
			return
		}
		// Accepted bodies are JSON objects with a non-empty string model that
		// the standard decoder agrees on.
		var m map[string]json.RawMessage
		if jerr := json.Unmarshal(body, &m); jerr != nil {
			t.Fatalf("accepted a body encoding/json rejects: %v", jerr)
		}
		var model string
		if jerr := json.Unmarshal(m["model"], &model); jerr != nil || model != got.Model || model == "" {
			t.Fatalf("model %q disagrees with decoder (%q, %v)", got.Model, model, jerr)
		}
		if got.MaxTokens < 0 {
			t.Fatalf("negative max tokens %d", got.MaxTokens)
		}
	})
}
