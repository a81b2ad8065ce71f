package openai

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

const (
	chatPath  = "/v1/chat/completions"
	complPath = "/v1/completions"
	embedPath = "/v1/embeddings"
)

// parseReference is the straightforward decoding ParseRequest must agree with.
func parseReference(path string, body []byte) (Request, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil || top == nil {
		return Request{}, errors.New("bad body")
	}
	var r Request
	raw, ok := top["model"]
	if !ok || string(raw) == "null" {
		return r, errors.New("no model")
	}
	if err := json.Unmarshal(raw, &r.Model); err != nil || r.Model == "" {
		return r, errors.New("bad model")
	}
	if raw, ok := top["stream"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &r.Stream); err != nil {
			return r, errors.New("bad stream")
		}
	}
	for _, k := range []string{"max_completion_tokens", "max_tokens"} {
		var n int
		if raw, ok := top[k]; ok && json.Unmarshal(raw, &n) == nil && n >= 0 && string(raw) != "null" {
			r.MaxTokens, r.HasMaxTokens = n, true
			break
		}
	}
	if raw, ok := top["stream_options"]; ok {
		var so map[string]json.RawMessage
		var inc bool
		if json.Unmarshal(raw, &so) == nil && json.Unmarshal(so["include_usage"], &inc) == nil {
			r.IncludeUsage = inc
		}
	}
	r.Prompt = promptReference(path, top)
	return r, nil
}

func promptReference(path string, top map[string]json.RawMessage) Prompt {
	value := func(key string) json.RawMessage {
		if raw := top[key]; string(raw) != "null" {
			return raw
		}
		return nil
	}
	flag := func(key string) Flag {
		raw, ok := top[key]
		var v bool
		switch {
		case !ok || string(raw) == "null":
			return FlagUnset
		case json.Unmarshal(raw, &v) != nil:
			return FlagInvalid
		case v:
			return FlagTrue
		}
		return FlagFalse
	}
	p := Prompt{AddGenerationPrompt: flag("add_generation_prompt"), AddSpecialTokens: flag("add_special_tokens")}
	switch path {
	case chatPath:
		p.Chat, p.Messages = true, value("messages")
	case complPath:
		p.Prompt = value("prompt")
	}
	return p
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
	`{"model":"m","messages": [ {"role":"user","content":[{"type":"text","text":"a"}]} ] ,"add_generation_prompt":false}`,
	`{"model":"m","prompt":[1,2,3],"add_special_tokens":false,"add_generation_prompt":null}`,
	`{"model":"m","prompt":["one"],"messages":null,"add_special_tokens":"no","add_generation_prompt":1}`,
	`{"model":"m","messages":"text","prompt":null,"messages":{},"Messages":[],"add_special_tokens":true}`,
	`{"model":"m","mess\u0061ges":[],"pr\u006fmpt":[[1]],"x":{"messages":[],"prompt":"inner"}}`,
}

var parsePaths = []string{chatPath, complPath, embedPath}

func TestParseRequestMatchesReference(t *testing.T) {
	for _, s := range parseSeeds {
		t.Run(s, func(t *testing.T) { checkParse(t, []byte(s)) })
	}
}

func checkParse(t *testing.T, body []byte) {
	// The validation alone, on any JSON value: json.Valid's verdict.
	var raw rawFields
	if valid, _ := scanRequest(body, &raw); valid != json.Valid(body) {
		t.Fatalf("scanRequest valid=%v, json.Valid=%v for %q", valid, !valid, body)
	}
	for _, path := range parsePaths {
		got, err := ParseRequest(path, body)
		want, werr := parseReference(path, body)
		if (err == nil) != (werr == nil) {
			t.Fatalf("ParseRequest err=%v, reference err=%v for %s %q", err, werr, path, body)
		}
		if err == nil {
			must.Eq(t, want, got, must.Sprintf("%s body %q", path, body))
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range parseSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(checkParse)
}

// TestParseRequestErrors pins the message of each kind of bad body (the
// client sees it in the 400's OpenAI error JSON) and its type, which the
// gateway reads to name the parameter at fault.
func TestParseRequestErrors(t *testing.T) {
	for _, tc := range []struct {
		body, msg string
		is        error  // a sentinel the error wraps
		field     string // else the *FieldError's field
	}{
		{`{"model":`, "malformed JSON body: unexpected end of JSON input", ErrMalformedJSON, ""},
		{`{"model":"m",}`, "malformed JSON body: invalid character '}' looking for beginning of object key string", ErrMalformedJSON, ""},
		{`[{"model":"m"}]`, "request body must be a JSON object", ErrNotObject, ""},
		{`{"messages":[]}`, "you must provide a model parameter", nil, "model"},
		{`{"model":null}`, "you must provide a model parameter", nil, "model"},
		{`{"model":""}`, "model must be a non-empty string", nil, "model"},
		{`{"model":7}`, "model must be a non-empty string", nil, "model"},
		{`{"model":"m","stream":"yes"}`, "stream must be a boolean", nil, "stream"},
	} {
		_, err := ParseRequest(chatPath, []byte(tc.body))
		if err == nil || err.Error() != tc.msg {
			t.Errorf("ParseRequest(%s) error %v, want %q", tc.body, err, tc.msg)
			continue
		}
		var fe *FieldError
		isField := errors.As(err, &fe)
		if tc.is != nil {
			must.ErrorIs(t, err, tc.is, must.Sprintf("body %s", tc.body))
			must.False(t, isField, must.Sprintf("body %s", tc.body))
		} else {
			must.True(t, isField, must.Sprintf("body %s", tc.body))
			must.Eq(t, tc.field, fe.Field, must.Sprintf("body %s", tc.body))
		}
	}
	// The syntax error stays reachable for a caller that wants its offset.
	_, err := ParseRequest(chatPath, []byte(`{"model":"m",}`))
	var se *json.SyntaxError
	must.True(t, errors.As(err, &se))
}

// TestParseRequestPrompt pins the prompt members: their raw values point
// into the body, null is absent, and a value of the wrong type is left for
// the engine to refuse (only the flags say so, as FlagInvalid).
func TestParseRequestPrompt(t *testing.T) {
	msgs := `[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name, path, body string
		want             Prompt
	}{
		{"chat", chatPath, `{"model":"m","messages":` + msgs + `}`,
			Prompt{Chat: true, Messages: json.RawMessage(msgs)}},
		{"chat flags", chatPath, `{"model":"m","messages":` + msgs + `,"add_generation_prompt":false,"add_special_tokens":true}`,
			Prompt{Chat: true, Messages: json.RawMessage(msgs), AddGenerationPrompt: FlagFalse, AddSpecialTokens: FlagTrue}},
		{"chat ignores prompt", chatPath, `{"model":"m","prompt":"p"}`, Prompt{Chat: true}},
		{"chat messages null", chatPath, `{"model":"m","messages":null}`, Prompt{Chat: true}},
		{"chat messages not an array", chatPath, `{"model":"m","messages":"hi"}`,
			Prompt{Chat: true, Messages: json.RawMessage(`"hi"`)}},
		{"chat messages repeated", chatPath, `{"model":"m","messages":[],"messages":` + msgs + `}`,
			Prompt{Chat: true, Messages: json.RawMessage(msgs)}},
		{"chat key case", chatPath, `{"model":"m","Messages":` + msgs + `}`, Prompt{Chat: true}},
		{"completion string", complPath, `{"model":"m","prompt":"Once upon"}`,
			Prompt{Prompt: json.RawMessage(`"Once upon"`)}},
		{"completion ids", complPath, `{"model":"m","prompt": [1, 2] ,"add_special_tokens":false}`,
			Prompt{Prompt: json.RawMessage(`[1, 2]`), AddSpecialTokens: FlagFalse}},
		{"completion ignores messages", complPath, `{"model":"m","messages":` + msgs + `}`, Prompt{}},
		{"completion prompt null", complPath, `{"model":"m","prompt":null,"add_special_tokens":null}`, Prompt{}},
		{"flags of the wrong type", complPath, `{"model":"m","prompt":7,"add_special_tokens":"no","add_generation_prompt":0}`,
			Prompt{Prompt: json.RawMessage(`7`), AddGenerationPrompt: FlagInvalid, AddSpecialTokens: FlagInvalid}},
		{"embeddings", embedPath, `{"model":"m","input":"x","prompt":"p","messages":[]}`, Prompt{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			r, err := ParseRequest(tc.path, body)
			must.NoError(t, err)
			must.Eq(t, tc.want, r.Prompt)
			for _, v := range [][]byte{r.Prompt.Messages, r.Prompt.Prompt} {
				if v != nil {
					must.True(t, within(body, v), must.Sprint("raw value not a sub-slice of the body"))
				}
			}
		})
	}
}

// within reports whether sub's bytes are part of b's backing array.
func within(b, sub []byte) bool {
	for i := range len(b) - len(sub) + 1 {
		if len(sub) > 0 && &b[i] == &sub[0] {
			return true
		}
	}
	return false
}

// TestParseRequestFields pins the routing fields other than the prompt,
// including the members a bad value of which the router leaves to the
// engine.
func TestParseRequestFields(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       Request
	}{
		{"minimal", `{"model":"m"}`, Request{Model: "m"}},
		{"escaped model", `{"model":"a\u002fb"}`, Request{Model: "a/b"}},
		{"stream", `{"model":"m","stream":true}`, Request{Model: "m", Stream: true}},
		{"stream null", `{"model":"m","stream":null}`, Request{Model: "m"}},
		{"max_tokens", `{"model":"m","max_tokens":16}`, Request{Model: "m", MaxTokens: 16, HasMaxTokens: true}},
		{"max_completion_tokens first", `{"model":"m","max_tokens":16,"max_completion_tokens":8}`,
			Request{Model: "m", MaxTokens: 8, HasMaxTokens: true}},
		{"bad max_completion_tokens", `{"model":"m","max_tokens":16,"max_completion_tokens":-8}`,
			Request{Model: "m", MaxTokens: 16, HasMaxTokens: true}},
		{"max_tokens not an integer", `{"model":"m","max_tokens":1.5}`, Request{Model: "m"}},
		{"include_usage", `{"model":"m","stream_options":{"include_usage":true}}`, Request{Model: "m", IncludeUsage: true}},
		{"include_usage not true", `{"model":"m","stream_options":{"include_usage":"true"}}`, Request{Model: "m"}},
		{"stream_options not an object", `{"model":"m","stream_options":[]}`, Request{Model: "m"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := ParseRequest(embedPath, []byte(tc.body))
			must.NoError(t, err)
			must.Eq(t, tc.want, r)
		})
	}
}

func TestFlagOr(t *testing.T) {
	for _, tc := range []struct {
		f         Flag
		def, want bool
	}{
		{FlagUnset, true, true}, {FlagUnset, false, false},
		{FlagTrue, false, true}, {FlagFalse, true, false},
		{FlagInvalid, true, true}, {FlagInvalid, false, false},
	} {
		must.Eq(t, tc.want, tc.f.Or(tc.def))
	}
}

// TestParseRequestAllocs pins the one allocation of a valid body: the model
// string.
func TestParseRequestAllocs(t *testing.T) {
	body := []byte(`{"model":"meta-llama/Llama-3.1-8B","messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":4,"stream_options":{"include_usage":true},"add_generation_prompt":true}`)
	must.Eq(t, 1.0, testing.AllocsPerRun(100, func() { _, _ = ParseRequest(chatPath, body) }))
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
