package tokens

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/shoenig/test/must"
)

// fakeLlamaServer answers /apply-template and /tokenize as llama-server
// does (shapes checked against the real one in test/e2e/llamacpp) and
// records what it was asked.
type fakeLlamaServer struct {
	mu       sync.Mutex
	template []map[string]json.RawMessage
	tokenize []map[string]json.RawMessage
	rendered string // the /apply-template answer's prompt, raw JSON
}

func (f *fakeLlamaServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	var body map[string]json.RawMessage
	if err := json.Unmarshal(b, &body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/apply-template":
		f.template = append(f.template, body)
		w.Write([]byte(`{"prompt":` + f.rendered + `}`))
	case "/tokenize":
		f.tokenize = append(f.tokenize, body)
		var s string
		ids := []string{"128000"} // BOS
		if json.Unmarshal(body["content"], &s) == nil {
			for range strings.Fields(s) {
				ids = append(ids, "7")
			}
		}
		w.Write([]byte(`{"tokens":[` + strings.Join(ids, ",") + `]}`))
	default:
		http.NotFound(w, r)
	}
}

func TestLlamaCppTokenizesAsTheEngineDoes(t *testing.T) {
	cases := []struct {
		name, path, body string
		rendered         string
		wantTemplate     map[string]string // members of the /apply-template body; nil: not asked
		wantContent      string
		wantTokens       int
	}{
		{name: "completion", path: "/v1/completions", body: `{"model":"m","prompt":"one two three"}`,
			wantContent: `"one two three"`, wantTokens: 4},
		{name: "completion of token ids", path: "/v1/completions", body: `{"model":"m","prompt":[1,2,3]}`,
			wantContent: `[1,2,3]`, wantTokens: 1},
		{name: "chat", path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			rendered:     `"<|user|> hi <|assistant|>"`,
			wantTemplate: map[string]string{"messages": `[{"role":"user","content":"hi"}]`},
			wantContent:  `"<|user|> hi <|assistant|>"`, wantTokens: 4},
		{name: "chat without the generation prompt", path: "/v1/chat/completions",
			body:         `{"model":"m","add_generation_prompt":false,"messages":[{"role":"user","content":"hi"}]}`,
			rendered:     `"<|user|> hi"`,
			wantTemplate: map[string]string{"messages": `[{"role":"user","content":"hi"}]`, "add_generation_prompt": "false"},
			wantContent:  `"<|user|> hi"`, wantTokens: 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeLlamaServer{rendered: tc.rendered}
			ts := httptest.NewServer(f)
			defer ts.Close()
			eng := NewEngine(EngineConfig{Replicas: func(string) []Replica {
				return []Replica{{Address: strings.TrimPrefix(ts.URL, "http://"), Engine: "llama_cpp"}}
			}})
			toks, err := eng.Tokenize(context.Background(), "m", promptOf(t, tc.path, tc.body))
			must.NoError(t, err)
			must.Len(t, tc.wantTokens, toks)
			if tc.wantTemplate == nil {
				must.Len(t, 0, f.template)
			} else {
				must.Len(t, 1, f.template)
				must.Eq(t, len(tc.wantTemplate), len(f.template[0]))
				for k, v := range tc.wantTemplate {
					must.Eq(t, v, string(f.template[0][k]), must.Sprint(k))
				}
			}
			must.Len(t, 1, f.tokenize)
			must.Eq(t, tc.wantContent, string(f.tokenize[0]["content"]))
			must.Eq(t, "true", string(f.tokenize[0]["add_special"]))
			must.Eq(t, "true", string(f.tokenize[0]["parse_special"]))
		})
	}
}

// An /apply-template answer is untrusted: one larger than the messages can
// render to is refused unread, and one whose prompt is not a string is an
// error, not a tokenization of whatever it holds.
func TestLlamaCppTemplateAnswerBounded(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name, rendered string
		refused        bool
	}{
		{"too large", `"` + strings.Repeat("x", 6*(templateSlack+64)+answerSlack) + `"`, true},
		{"not a string", `{"a":1}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := httptest.NewServer(&fakeLlamaServer{rendered: tc.rendered})
			defer ts.Close()
			eng := NewEngine(EngineConfig{Replicas: func(string) []Replica {
				return []Replica{{Address: strings.TrimPrefix(ts.URL, "http://"), Engine: "llama_cpp"}}
			}})
			_, err := eng.Tokenize(context.Background(), "m", promptOf(t, "/v1/chat/completions", body))
			must.Error(t, err)
			must.Eq(t, tc.refused, errors.Is(err, ErrAnswerRefused))
		})
	}
}
