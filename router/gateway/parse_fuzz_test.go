package gateway

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/shoenig/test/must"
)

// parseReference is the straightforward decoding parseRequest must agree with.
func parseReference(body []byte) (requestFields, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return requestFields{}, errors.New("bad body")
	}
	var f requestFields
	raw, ok := top["model"]
	if !ok || string(raw) == "null" {
		return f, errors.New("no model")
	}
	if err := json.Unmarshal(raw, &f.Model); err != nil || f.Model == "" {
		return f, errors.New("bad model")
	}
	if raw, ok := top["stream"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &f.Stream); err != nil {
			return f, errors.New("bad stream")
		}
	}
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		var n int
		if raw, ok := top[k]; ok && json.Unmarshal(raw, &n) == nil && n >= 0 && string(raw) != "null" {
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

var parseSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`,
	`{"model":"m","prompt":"x","max_tokens":16,"stream_options":{"include_usage":true}}`,
	`{"model":1}`, `[]`, `null`, `{"model":"m","stream":"yes"}`, `{`, ``, `{"model":"\u0000"}`,
	`{"model":"m","max_completion_tokens":-1,"tools":[{"type":"function"}]}`,
	` { "mod\u0065l" : "a\"b" , "stream" : false , "max_tokens" : 1e3 } `,
	`{"model":"m","model":"n","stream":null,"stream_options":null}`,
	`{"Model":"m"}`, `{"model":"` + "\xff" + `"}`, `{"x":{"model":"inner"},"model":"outer","y":["}",{"]":"{"}]}`,
	`{"model":"m","max_tokens":16.0,"max_completion_tokens":"8"}`,
}

func TestParseRequestMatchesReference(t *testing.T) {
	for _, s := range parseSeeds {
		t.Run(s, func(t *testing.T) { checkParse(t, []byte(s)) })
	}
}

func checkParse(t *testing.T, body []byte) {
	got, err := parseRequest(body)
	want, werr := parseReference(body)
	if (err == nil) != (werr == nil) {
		t.Fatalf("parseRequest err=%v, reference err=%v for %q", err, werr, body)
	}
	if err == nil {
		must.Eq(t, want, got, must.Sprintf("body %q", body))
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkParse)
}
