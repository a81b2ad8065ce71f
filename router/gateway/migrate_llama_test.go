package gateway

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// fakeLlama speaks llama-server's OpenAI streaming shapes as captured from
// llama-server (build b1-80fb11a) with return_tokens, verbose and
// timings_per_token: a completion's ids only in __verbose.tokens, no prompt
// ids anywhere, chat chunks with timings.predicted_n and no ids, "id" after
// "object". Its model is greedy: a prompt's text is one token per byte (BOS
// 1 first when the prompt starts with a string, as llama-server's mixed
// prompts), and the next token, a letter, is a function of the context, so
// a continuation with the same context goes on as the uninterrupted run.
// As llama-server, it streams no event for a token whose text ends inside a
// UTF-8 character (here: 'k'; the next event has both texts and its own id
// only) and holds back the text of one that may start a stop string (here:
// 'm': an event with its id and no text).
type fakeLlama struct {
	srv *httptest.Server
	n   atomic.Int64 // completion ids
}

func startFakeLlama(t *testing.T) string {
	t.Helper()
	f := &fakeLlama{}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return addr(f.srv)
}

// llamaReq is what the fake reads of a request.
type llamaReq struct {
	Prompt        json.RawMessage `json:"prompt"`
	Messages      []struct{ Role, Content string }
	MaxTokens     int  `json:"max_tokens"`
	Stream        bool `json:"stream"`
	ReturnTokens  bool `json:"return_tokens"`
	Verbose       bool `json:"verbose"`
	TimingsPer    bool `json:"timings_per_token"`
	Continue      bool `json:"continue_final_message"`
	AddGenPrompt  *bool
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

func (f *fakeLlama) serve(w http.ResponseWriter, r *http.Request) {
	var q llamaReq
	if err := json.NewDecoder(r.Body).Decode(&q); err != nil || !q.Stream || q.MaxTokens < 1 {
		http.Error(w, `{"error":{"code":400,"message":"bad request","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	chat := r.URL.Path == pathChat
	ctx, ok := f.context(&q, chat)
	if !ok {
		http.Error(w, `{"error":{"code":400,"message":"Cannot set both add_generation_prompt and continue_final_message to true.","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	id := fmt.Sprintf(`"chatcmpl-%d"`, f.n.Add(1))
	head := `"created":1795926653,"model":"m","system_fingerprint":"b1-80fb11a"`
	send := func(s string) { fmt.Fprintf(w, "data: %s\n\n", s); w.(http.Flusher).Flush() }
	if chat {
		send(`{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],` + head + `,"id":` + id + `,"object":"chat.completion.chunk"}`)
	}
	nPrompt := len(ctx)
	pending := ""
	for i := 1; i <= q.MaxTokens; i++ {
		tok := nextFakeToken(ctx)
		ctx = append(ctx, tok)
		if !chat && tok == 'k' && i < q.MaxTokens {
			pending += "k"
			continue
		}
		s := pending + string(rune(tok))
		pending = ""
		if !chat && tok == 'm' && i < q.MaxTokens {
			s, pending = "", s
		}
		text, _ := json.Marshal(s)
		tokens := "[]"
		if q.ReturnTokens {
			tokens = fmt.Sprintf("[%d]", tok)
		}
		if chat {
			timings := ""
			if q.TimingsPer {
				timings = fmt.Sprintf(`,"timings":{"cache_n":0,"prompt_n":%d,"predicted_n":%d}`, nPrompt, i)
			}
			send(`{"choices":[{"finish_reason":null,"index":0,"delta":{"content":` + string(text) + `}}],` + head + `,"id":` + id + `,"object":"chat.completion.chunk"` + timings + `}`)
			continue
		}
		verbose := ""
		if q.Verbose {
			verbose = fmt.Sprintf(`,"__verbose":{"index":0,"content":%s,"tokens":%s,"stop":false,"id_slot":-1,"tokens_predicted":%d,"tokens_evaluated":%d}`, text, tokens, i, nPrompt)
		}
		send(`{"choices":[{"text":` + string(text) + `,"index":0,"logprobs":null,"finish_reason":null}],` + head + `,"object":"text_completion","id":` + id + verbose + `}`)
	}
	usage := fmt.Sprintf(`"usage":{"completion_tokens":%d,"prompt_tokens":%d,"total_tokens":%d}`, q.MaxTokens, nPrompt, q.MaxTokens+nPrompt)
	timings := fmt.Sprintf(`"timings":{"cache_n":0,"prompt_n":%d,"predicted_n":%d}`, nPrompt, q.MaxTokens)
	if chat {
		send(`{"choices":[{"finish_reason":"length","index":0,"delta":{}}],` + head + `,"id":` + id + `,"object":"chat.completion.chunk"}`)
		if q.StreamOptions.IncludeUsage {
			send(`{"choices":[],` + head + `,"id":` + id + `,"object":"chat.completion.chunk",` + usage + `,` + timings + `}`)
		}
	} else {
		verbose := ""
		if q.Verbose {
			verbose = `,"__verbose":{"index":0,"content":"","tokens":[],"stop":true,"prompt":"<|begin_of_text|>x \"q\"",` + timings + `}`
		}
		u := ""
		if q.StreamOptions.IncludeUsage {
			u = "," + usage
		}
		send(`{"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],` + head + `,"object":"text_completion"` + u + `,"id":` + id + verbose + `,` + timings + `}`)
	}
	send("[DONE]")
}

// context is the request's prompt as the fake's tokens; !ok for a chat
// llama-server refuses.
func (f *fakeLlama) context(q *llamaReq, chat bool) ([]int32, bool) {
	if chat {
		if q.Continue && (q.AddGenPrompt == nil || *q.AddGenPrompt) {
			return nil, false
		}
		s := ""
		for i, m := range q.Messages {
			s += "<" + m.Role + ">" + m.Content
			if i < len(q.Messages)-1 || !q.Continue {
				s += "<end>"
			}
		}
		if !q.Continue {
			s += "<assistant>"
		}
		return fakeTokenize(s, true), true
	}
	var s string
	if json.Unmarshal(q.Prompt, &s) == nil {
		return fakeTokenize(s, true), true
	}
	var elems []json.RawMessage
	_ = json.Unmarshal(q.Prompt, &elems)
	var out []int32
	for i, e := range elems {
		var id int32
		if json.Unmarshal(e, &s) == nil {
			out = append(out, fakeTokenize(s, i == 0)...)
		} else if json.Unmarshal(e, &id) == nil {
			out = append(out, id)
		}
	}
	return out, true
}

func fakeTokenize(s string, bos bool) []int32 {
	var out []int32
	if bos {
		out = append(out, 1)
	}
	for _, b := range []byte(s) {
		out = append(out, int32(b))
	}
	return out
}

func nextFakeToken(ctx []int32) int32 {
	h := fnv.New32a()
	for _, v := range ctx {
		fmt.Fprint(h, v, ",")
	}
	return 'a' + int32(h.Sum32()%26)
}

// UnmarshalJSON reads add_generation_prompt, absent or not.
func (q *llamaReq) UnmarshalJSON(b []byte) error {
	type plain llamaReq
	var v struct {
		plain
		AddGenPrompt *bool `json:"add_generation_prompt"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	*q = llamaReq(v.plain)
	q.AddGenPrompt = v.AddGenPrompt
	return nil
}

var llamaMigrationRequests = []struct{ name, path, body string }{
	{"completions", pathCompletions, `{"model":"m","prompt":"once upon a time","max_tokens":20,"temperature":0,"seed":1,"stream":true,"stream_options":{"include_usage":true}}`},
	{"completions of ids", pathCompletions, `{"model":"m","prompt":[1,80,81],"max_tokens":20,"temperature":0,"stream":true}`},
	{"completions mixed", pathCompletions, `{"model":"m","prompt":["ab",7,"cd"],"max_tokens":20,"temperature":0,"stream":true}`},
	{"chat", pathChat, `{"model":"m","messages":[{"role":"user","content":"tell me more"}],"max_tokens":20,"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`},
}

// A llama-server stream whose engine is killed after k events goes on on
// another llama-server: the same text as the uninterrupted greedy run, one
// id, usage for the whole answer, none of the members the router asked for
// (__verbose, per-token timings) reaching the client.
func TestLlamaMigrationContinuesTokenExact(t *testing.T) {
	llA, llB := startFakeLlama(t), startFakeLlama(t)
	for _, rq := range llamaMigrationRequests {
		whole := newFaultyEngine(t, llA, -1, crashFault)
		h := engineHarness(t, Config{}, engineLlamaCpp, migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(whole.srv)})
		want := readStream(t, h.post(rq.path, rq.body))
		must.True(t, want.done)
		must.EqOp(t, 20, len(want.text))
		for _, after := range []int{1, 3, 8, 12, 15} {
			t.Run(fmt.Sprintf("%s/after %d events", rq.name, after), func(t *testing.T) {
				bad := newFaultyEngine(t, llA, after, crashFault)
				good := newFaultyEngine(t, llB, -1, crashFault)
				h := engineHarness(t, Config{}, engineLlamaCpp, migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
				resp := h.post(rq.path, rq.body)
				body := readAllString(t, resp)
				got := readStream(t, &http.Response{StatusCode: 200, Body: io.NopCloser(strings.NewReader(body))})
				must.EqOp(t, want.text, got.text)
				must.EqOp(t, want.finish, got.finish)
				must.Eq(t, want.usage, got.usage)
				must.MapLen(t, 1, got.ids)
				must.True(t, got.done)
				must.EqOp(t, "", got.errorCode)
				must.StrNotContains(t, body, "__verbose")
				must.StrNotContains(t, body, "predicted_n\":1,") // per-token timings stay the router's
				must.EqOp(t, int64(1), good.hits.Load())
				must.EqOp(t, 1.0, promtest.ToFloat64(h.m.Migrations.WithLabelValues("m", metrics.MigrationEngineFailed)))
				must.EqOp(t, 0.0, promtest.ToFloat64(h.m.StreamErrors.WithLabelValues("m", "upstream_broken")))
			})
		}
	}
}

// The continuation llama-server gets: a completion's prompt then the ids
// sent as a mixed prompt, max_tokens less what was sent, return_tokens and
// verbose; a chat's text as an open assistant message, its count from
// timings.predicted_n.
func TestLlamaContinuationRequest(t *testing.T) {
	llA, llB := startFakeLlama(t), startFakeLlama(t)
	bad := newFaultyEngine(t, llA, 4, crashFault) // "e", "kc" (no event for "k"), "c", "y": 5 tokens
	good := newFaultyEngine(t, llB, -1, crashFault)
	h := engineHarness(t, Config{}, engineLlamaCpp, migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
	_ = readStream(t, h.post(pathCompletions, llamaMigrationRequests[0].body))
	first := bad.last.Load().(string)
	must.StrContains(t, first, `"return_tokens":true`)
	must.StrContains(t, first, `"verbose":true`)
	must.StrNotContains(t, first, `"return_token_ids"`)
	var c struct {
		Prompt       []json.RawMessage `json:"prompt"`
		MaxTokens    int               `json:"max_tokens"`
		ReturnTokens bool              `json:"return_tokens"`
		Verbose      bool              `json:"verbose"`
	}
	must.NoError(t, json.Unmarshal([]byte(good.last.Load().(string)), &c))
	must.EqOp(t, 15, c.MaxTokens)
	must.True(t, c.ReturnTokens)
	must.True(t, c.Verbose)
	p, err := json.Marshal(c.Prompt)
	must.NoError(t, err)
	must.EqOp(t, `["once upon a time",101,"kc",99,121]`, string(p)) // the "k" without an id as text

	bad = newFaultyEngine(t, llA, 3, crashFault) // role chunk + 2 tokens
	good = newFaultyEngine(t, llB, -1, crashFault)
	h = engineHarness(t, Config{}, engineLlamaCpp, migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
	_ = readStream(t, h.post(pathChat, llamaMigrationRequests[3].body))
	must.StrContains(t, bad.last.Load().(string), `"timings_per_token":true`)
	var cc struct {
		Messages             []struct{ Role, Content string } `json:"messages"`
		MaxTokens            int                              `json:"max_tokens"`
		ContinueFinalMessage bool                             `json:"continue_final_message"`
		AddGenerationPrompt  bool                             `json:"add_generation_prompt"`
	}
	must.NoError(t, json.Unmarshal([]byte(good.last.Load().(string)), &cc))
	must.EqOp(t, 18, cc.MaxTokens)
	must.True(t, cc.ContinueFinalMessage)
	must.False(t, cc.AddGenerationPrompt)
	must.SliceLen(t, 2, cc.Messages)
	must.EqOp(t, 2, len(cc.Messages[1].Content))
}

// A llama-server that stalls (SIGSTOP) mid-stream is left after
// stream_idle and the stream goes on on another, token-exact.
func TestLlamaMigrationAfterStall(t *testing.T) {
	llA, llB := startFakeLlama(t), startFakeLlama(t)
	rq := llamaMigrationRequests[0]
	whole := newFaultyEngine(t, llA, -1, crashFault)
	want := readStream(t, engineHarness(t, Config{}, engineLlamaCpp, migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(whole.srv)}).post(rq.path, rq.body))
	bad := newFaultyEngine(t, llA, 5, freezeFault)
	good := newFaultyEngine(t, llB, -1, crashFault)
	h := engineHarness(t, Config{}, engineLlamaCpp, migrationPolicy("300ms", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
	got := readStream(t, h.post(rq.path, rq.body))
	must.EqOp(t, want.text, got.text)
	must.Eq(t, want.usage, got.usage)
	must.EqOp(t, "", got.errorCode)
	must.EqOp(t, 1.0, promtest.ToFloat64(h.m.Migrations.WithLabelValues("m", metrics.MigrationStreamIdle)))
}

// A llama-server stream is continued on llama-server engines only: token
// ids are its tokenizer's, not a vLLM engine's of the same model.
func TestLlamaMigratesToLlamaOnly(t *testing.T) {
	ll, sim := startFakeLlama(t), startSim(t)
	bad := newFaultyEngine(t, ll, 3, crashFault)
	other := newFaultyEngine(t, sim, -1, crashFault)
	h := newHarnessWith(t, Config{}, migrationPolicy("5s", 2), nil)
	h.pool.Set([]discovery.Instance{
		{ID: "a", Address: addr(bad.srv), Meta: map[string]string{discovery.MetaModel: "m", discovery.MetaEngine: engineLlamaCpp}},
		{ID: "b", Address: addr(other.srv), Meta: map[string]string{discovery.MetaModel: "m", discovery.MetaEngine: engineSim}},
	})
	got := readStream(t, h.post(pathCompletions, llamaMigrationRequests[0].body))
	must.EqOp(t, "upstream_error", got.errorCode)
	must.EqOp(t, int64(0), other.hits.Load())
	must.EqOp(t, 1.0, promtest.ToFloat64(h.m.MigrationsFailed.WithLabelValues("m", metrics.MigrationNoWorker)))
}

func TestLlamaPrompt(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`"ab"`, `["ab",5,6]`},
		{`[1,2]`, `[1,2,5,6]`},
		{`["ab",3,"c"]`, `["ab",3,"c",5,6]`},
		{`["ab"]`, `["ab",5,6]`},
		{`["a","b"]`, ""},
		{`[[1],[2]]`, ""},
		{`{"prompt_string":"x"}`, ""},
		{`[]`, ""},
		{`[1.5]`, ""},
	} {
		got, err := llamaPrompt(json.RawMessage(tc.in), []int32{5, 6}, nil)
		if tc.want == "" {
			must.ErrorIs(t, err, errNotContinuable, must.Sprint(tc.in))
			continue
		}
		must.NoError(t, err)
		must.EqOp(t, tc.want, string(got))
	}
}

// Ids llama-server does not stream: a token whose text ends inside a UTF-8
// character (no event; the next has both texts, its own id and the count)
// goes into the continuation as the text the client received; ids whose
// text was held back (stop strings) are left out and generated again.
func TestLlamaMissingIDs(t *testing.T) {
	body := `{"model":"m","prompt":"hi","max_tokens":10,"stream":true}`
	f, err := openai.ParseRequest(pathCompletions, []byte(body))
	must.NoError(t, err)
	x := &exchange{req: &scoring.Request{Model: "m", Path: pathCompletions, Body: []byte(body)}, fields: f, body: []byte(body),
		pol: policy.Resolved{MigrationLimit: 2}}
	ev := func(text string, ids string, n int) string {
		return fmt.Sprintf(`data: {"choices":[{"text":%q,"index":0,"logprobs":null,"finish_reason":null}],"created":1,"object":"text_completion","id":"c","__verbose":{"index":0,"content":%q,"tokens":%s,"stop":false,"tokens_predicted":%d}}`+"\n\n", text, text, ids, n)
	}
	tr := newStreamTrack(x, &scoring.Worker{Engine: engineLlamaCpp})
	out := string(tr.filter([]byte(ev(" a", "[7]", 1) + ev("éb", "[9]", 3) + ev("c", "[10]", 4) + ev("", "[11]", 5) + ev("", "[12]", 6))))
	must.StrNotContains(t, out, "__verbose")
	must.StrContains(t, out, `"text":"éb"`)
	must.True(t, tr.continuable())
	next, err := tr.continuation(x)
	must.NoError(t, err)
	must.StrContains(t, string(next.body), `"prompt":["hi",7,"éb",10]`)
	must.EqOp(t, 6, next.fields.MaxTokens) // 4 tokens the client has: 2 held back are generated again
}

func TestCutMember(t *testing.T) {
	for _, tc := range []struct{ in, key, want string }{
		{`{"a":1,"__verbose":{"content":"\"}","tokens":[1]},"b":2}`, "__verbose", `{"a":1,"b":2}`},
		{`{"__verbose":{"x":[1]},"a":1}`, "__verbose", `{"a":1}`},
		{`{"a":"\"timings\":{}","timings":{"predicted_n":3}}`, "timings", `{"a":"\"timings\":{}"}`},
		{`{"a":1}`, "timings", `{"a":1}`},
		{`{"a":1,"__verbose":{"c":"\\\"","t":[]}}`, "__verbose", `{"a":1}`},
		{`{"__verbose":{"c":"x"`, "__verbose", `{"__verbose":{"c":"x"`},
		{`{"a":1,"timings":null}`, "timings", `{"a":1}`},
	} {
		must.EqOp(t, tc.want, string(cutMember([]byte(tc.in), tc.key)))
	}
}

// llamaIDsEngine streams a 16-token completion as llama-server does with
// return_tokens and verbose: each token's id in __verbose.
func llamaIDsEngine() *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		head := `"created":1,"model":"m","system_fingerprint":"b1-80fb11a","object":"text_completion","id":"chatcmpl-x"`
		for i := range 16 {
			fmt.Fprintf(w, `data: {"choices":[{"text":" tok%d","index":0,"logprobs":null,"finish_reason":null}],%s,"__verbose":{"index":0,"content":" tok%d","tokens":[%d],"stop":false,"id_slot":-1,"tokens_predicted":%d,"tokens_evaluated":11}}`+"\n\n", i, head, i, 1000+i, i+1)
			w.(http.Flusher).Flush()
		}
		fmt.Fprint(w, `data: {"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}],`+head+`,"usage":{"completion_tokens":16,"prompt_tokens":11,"total_tokens":27}}`+"\n\ndata: [DONE]\n\n")
	}))
}

// BenchmarkProxyStreamingLlamaTokens is BenchmarkProxyStreamingTokenIDs for
// llama-server's shapes: every event decoded with encoding/json and its
// __verbose member cut out.
func BenchmarkProxyStreamingLlamaTokens(b *testing.B) {
	e := llamaIDsEngine()
	defer e.Close()
	for _, tc := range []struct {
		name  string
		limit int
	}{{"migrate", policy.DefaultMigrationLimit}, {"off", 0}} {
		b.Run(tc.name, func(b *testing.B) {
			limit := tc.limit
			doc := &policy.Document{Policy: scoring.RoundRobin, MigrationLimit: &limit}
			h := engineHarness(b, Config{}, engineLlamaCpp, doc, map[string]string{"a": "m@" + addr(e)})
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := client.Post(h.srv.URL+pathCompletions, "application/json",
						strings.NewReader(`{"model":"m","prompt":"hello","max_tokens":16,"stream":true}`))
					if err != nil {
						b.Error(err)
						return
					}
					body, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if strings.Contains(string(body), "__verbose") != (limit == 0) {
						b.Errorf("__verbose reached the client with migration_limit %d", limit)
						return
					}
				}
			})
		})
	}
}
