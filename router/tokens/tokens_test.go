package tokens

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/sim/server"
	"github.com/shoenig/test/must"
)

// simServer runs a real oasis-sim HTTP server in process.
func simServer(t *testing.T) *httptest.Server {
	t.Helper()
	s, err := server.New(server.Config{Model: "sim-model"})
	must.NoError(t, err)
	t.Cleanup(func() { _ = s.Close() })
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts
}

var bodies = []struct {
	name, path, body string
}{
	{"chat string", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hello, world!"}]}`},
	{"chat parts", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b c"}]}]}`},
	{"chat no generation prompt", "/v1/chat/completions", `{"model":"sim-model","add_generation_prompt":false,"messages":[{"role":"user","content":"x y z"}]}`},
	{"completion", "/v1/completions", `{"model":"sim-model","prompt":"Once upon a time"}`},
	{"completion no special", "/v1/completions", `{"model":"sim-model","prompt":"Once upon a time","add_special_tokens":false}`},
}

// promptOf parses body as the gateway does and returns its prompt.
func promptOf(t testing.TB, path, body string) openai.Prompt {
	t.Helper()
	r, err := openai.ParseRequest(path, []byte(body))
	must.NoError(t, err)
	return r.Prompt
}

// The sim tokenizer gives exactly the ids a real oasis-sim computes, checked
// through the engine round trip against a real oasis-sim server.
func TestSimMatchesEngineRoundTrip(t *testing.T) {
	ts := simServer(t)
	addr := strings.TrimPrefix(ts.URL, "http://")
	eng := NewEngine(EngineConfig{Replicas: func(string) []Replica { return []Replica{{Address: addr, Engine: "sim"}} }})
	for _, b := range bodies {
		t.Run(b.name, func(t *testing.T) {
			p := promptOf(t, b.path, b.body)
			want, err := eng.Tokenize(context.Background(), "sim-model", p)
			must.NoError(t, err)
			must.SliceNotEmpty(t, want)
			got, err := Sim{}.Tokenize(context.Background(), "sim-model", p)
			must.NoError(t, err)
			must.Eq(t, want, got)
		})
	}
}

func TestEngineCacheAndFailover(t *testing.T) {
	ts := simServer(t)
	addr := strings.TrimPrefix(ts.URL, "http://")
	var mu sync.Mutex
	calls := 0
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		calls++
		mu.Unlock()
		// forward to the sim
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, ts.URL+r.URL.Path, r.Body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			w.WriteHeader(502)
			return
		}
		defer resp.Body.Close()
		w.WriteHeader(resp.StatusCode)
		buf := make([]byte, 1<<16)
		for {
			n, err := resp.Body.Read(buf)
			_, _ = w.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}))
	defer counting.Close()
	dead := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(503) }))
	defer dead.Close()
	reps := []Replica{
		{Address: strings.TrimPrefix(dead.URL, "http://"), Engine: "vllm"},
		{Address: strings.TrimPrefix(counting.URL, "http://"), Engine: "vllm"},
		{Address: addr, Engine: "openai_compat"}, // no /tokenize: never asked
	}
	eng := NewEngine(EngineConfig{Replicas: func(string) []Replica { return reps }})
	p := promptOf(t, bodies[0].path, bodies[0].body)
	var wg sync.WaitGroup
	results := make([][]uint32, 8)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			toks, err := eng.Tokenize(context.Background(), "sim-model", p)
			if err == nil {
				results[i] = toks
			}
		}()
	}
	wg.Wait()
	for _, r := range results {
		must.Eq(t, results[0], r)
		must.SliceNotEmpty(t, r)
	}
	for i := 0; i < 5; i++ {
		_, err := eng.Tokenize(context.Background(), "sim-model", p)
		must.NoError(t, err)
	}
	mu.Lock()
	must.Eq(t, 1, calls, must.Sprint("one round trip for a repeated prompt"))
	mu.Unlock()
	hits, misses := eng.CacheStats()
	must.Eq(t, int64(1), misses)
	must.Eq(t, int64(12), hits)

	none := NewEngine(EngineConfig{Replicas: func(string) []Replica { return reps[2:] }})
	_, err := none.Tokenize(context.Background(), "sim-model", p)
	must.ErrorContains(t, err, "no healthy replica")
}

func TestEngineCacheBounded(t *testing.T) {
	e := NewEngine(EngineConfig{CacheTokens: 10, Replicas: func(string) []Replica { return nil }})
	e.add([32]byte{1}, make([]uint32, 6))
	e.add([32]byte{2}, make([]uint32, 6))
	must.MapLen(t, 1, e.entries)
	must.Eq(t, 6, e.size)
	e.add([32]byte{3}, make([]uint32, 11)) // larger than the whole cache: not kept
	must.MapLen(t, 1, e.entries)
}

func TestBytesDeterministicPrefixes(t *testing.T) {
	a := `{"model":"m","messages":[{"role":"system","content":"shared system prompt, long enough"},{"role":"user","content":"one"}]}`
	b := `{"model":"m","messages":[{"role":"system","content":"shared system prompt, long enough"},{"role":"user","content":"two"}]}`
	ta, err := Bytes{}.Tokenize(context.Background(), "m", promptOf(t, "/v1/chat/completions", a))
	must.NoError(t, err)
	tb, err := Bytes{}.Tokenize(context.Background(), "m", promptOf(t, "/v1/chat/completions", b))
	must.NoError(t, err)
	// "system\0" + 33 bytes + "\0" + "user\0" = 46 bytes shared → 11 whole pseudo-tokens.
	must.Eq(t, ta[:11], tb[:11])
	must.NotEq(t, ta, tb)
	tc, err := Bytes{}.Tokenize(context.Background(), "m", promptOf(t, "/v1/completions", `{"model":"m","prompt":"abcdefgh"}`))
	must.NoError(t, err)
	must.SliceLen(t, 3, tc) // the JSON string with its quotes: 10 bytes
}

func TestTokenizeRefusesMissingPrompts(t *testing.T) {
	cases := []struct{ path, body, err string }{
		{"/v1/chat/completions", `{"model":"m"}`, "messages: request has no prompt"},
		{"/v1/chat/completions", `{"model":"m","messages":null}`, "messages: request has no prompt"},
		{"/v1/completions", `{"model":"m"}`, "prompt: request has no prompt"},
		{"/v1/embeddings", `{"model":"m","input":"x"}`, "prompt: request has no prompt"},
		{"/v1/chat/completions", `{"model":"m","messages":[],"add_generation_prompt":"yes"}`, "add_generation_prompt must be a boolean"},
		{"/v1/completions", `{"model":"m","prompt":"x","add_special_tokens":1}`, "add_special_tokens must be a boolean"},
	}
	eng := NewEngine(EngineConfig{Replicas: func(string) []Replica { return nil }})
	for _, tc := range cases {
		p := promptOf(t, tc.path, tc.body)
		for _, tok := range []Tokenizer{Sim{}, Bytes{}, eng} {
			_, err := tok.Tokenize(context.Background(), "m", p)
			must.ErrorContains(t, err, tc.err, must.Sprintf("%T %s", tok, tc.body))
		}
	}
	_, err := Sim{}.Tokenize(context.Background(), "m", promptOf(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`))
	must.ErrorContains(t, err, "content")
	_, err = Sim{}.Tokenize(context.Background(), "m", promptOf(t, "/v1/chat/completions", `{"model":"m","messages":[]}`))
	must.ErrorIs(t, err, ErrNoPrompt)
}

func TestAutoModes(t *testing.T) {
	reps := map[string][]Replica{
		"sim":   {{Engine: "sim"}, {Engine: "sim"}},
		"mixed": {{Engine: "sim"}, {Engine: "vllm"}},
		"llama": {{Engine: "llama_cpp"}},
	}
	a := NewAuto(func(m string) []Replica { return reps[m] }, nil)
	must.Eq(t, "sim", a.Mode("sim"))
	must.Eq(t, "engine", a.Mode("mixed"))
	must.Eq(t, "engine", a.Mode("llama")) // /tokenize and /apply-template (llamacpp.go)
	must.Eq(t, "bytes", a.Mode("unknown"))

	p := promptOf(t, bodies[0].path, bodies[0].body)
	req := &scoring.Request{Model: "sim", Path: bodies[0].path, Body: []byte(bodies[0].body), Prompt: p}
	a.Prepare(req)
	got, err := req.PromptTokens(context.Background())
	must.NoError(t, err)
	want, _ := Sim{}.Tokenize(context.Background(), "sim", p)
	must.Eq(t, want, got)

	// Prepare runs per request: no allocation for an Auto from NewAuto.
	must.Eq(t, 0.0, testing.AllocsPerRun(100, func() { a.Prepare(&scoring.Request{}) }))
	// An Auto built as a literal prepares the same.
	lit := &Auto{Replicas: a.Replicas, Engine: a.Engine}
	req = &scoring.Request{Model: "sim", Path: bodies[0].path, Body: []byte(bodies[0].body), Prompt: p}
	lit.Prepare(req)
	got, err = req.PromptTokens(context.Background())
	must.NoError(t, err)
	must.Eq(t, want, got)
}
