package gateway

import (
	"encoding/json"
	"errors"
	"strings"
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
	`{"model":"m","n":-0.5e+3,"a":[1,-0,0.0,1E9,true,false,null,"\ud800\/\b\f\n\r\t"]}`,
	`{"model":"m","n":01}`, `{"model":"m","n":1.}`, `{"model":"m","n":-}`, `{"model":"m","n":1e}`,
	`{"model":"m","s":"\x"}`, `{"model":"m","s":"\u12g4"}`, "{\"model\":\"m\t\"}", `{"model":"m",}`,
	`{"model":"m"}x`, `{"model" "m"}`, `{"model":"m" "x":1}`, `[1,]`, `[1 2]`, `{"a":tru}`, ` 12 `, `"s"`,
	`{"model":"m","stream_options":{"include_usage":true},"stream_options":{"x":1}}`, "\t{\r\n}\n",
}

func TestParseRequestMatchesReference(t *testing.T) {
	for _, s := range parseSeeds {
		t.Run(s, func(t *testing.T) { checkParse(t, []byte(s)) })
	}
}

func checkParse(t *testing.T, body []byte) {
	got, err := parseRequest(body)
	// The validation alone, on any JSON value: json.Valid's verdict.
	var raw rawFields
	if valid, _ := scanRequest(body, &raw); valid != json.Valid(body) {
		t.Fatalf("scanRequest valid=%v, json.Valid=%v for %q", valid, !valid, body)
	}
	want, werr := parseReference(body)
	if (err == nil) != (werr == nil) {
		t.Fatalf("parseRequest err=%v, reference err=%v for %q", err, werr, body)
	}
	if err == nil {
		must.Eq(t, want, got, must.Sprintf("body %q", body))
	}
}

// TestParseRequestErrors pins the message of each kind of bad body: the
// client sees it in the 400's OpenAI error JSON.
func TestParseRequestErrors(t *testing.T) {
	for _, tc := range []struct{ body, msg string }{
		{`{"model":`, "malformed JSON body: unexpected end of JSON input"},
		{`{"model":"m",}`, "malformed JSON body: invalid character '}' looking for beginning of object key string"},
		{`[{"model":"m"}]`, "request body must be a JSON object"},
		{`{"messages":[]}`, "you must provide a model parameter"},
		{`{"model":null}`, "you must provide a model parameter"},
		{`{"model":""}`, "model must be a non-empty string"},
		{`{"model":7}`, "model must be a non-empty string"},
		{`{"model":"m","stream":"yes"}`, "stream must be a boolean"},
	} {
		_, err := parseRequest([]byte(tc.body))
		if err == nil || err.Error() != tc.msg {
			t.Errorf("parseRequest(%s) error %v, want %q", tc.body, err, tc.msg)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkParse)
}

func TestScanRequestDepthLimit(t *testing.T) {
	// encoding/json refuses more than 10000 nested arrays and objects.
	for _, n := range []int{maxJSONDepth - 1, maxJSONDepth, maxJSONDepth + 1} {
		for _, open := range []string{"[", `{"a":`} {
			closer, inner := "]", ""
			if open != "[" {
				closer, inner = "}", "1"
			}
			arr := strings.Repeat(open, n) + inner + strings.Repeat(closer, n)
			obj := `{"model":"m","x":` + strings.Repeat(open, n-1) + inner + strings.Repeat(closer, n-1) + `}`
			for _, b := range []string{arr, obj} {
				var raw rawFields
				valid, _ := scanRequest([]byte(b), &raw)
				must.Eq(t, json.Valid([]byte(b)), valid, must.Sprintf("depth %d, %s", n, open))
				must.Eq(t, n <= maxJSONDepth, valid, must.Sprintf("depth %d, %s", n, open))
			}
		}
	}
}
