package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/oasis-llm/oasis/internal/tokenizer"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/sim/engine"
	simserver "github.com/oasis-llm/oasis/sim/server"
)

// These tests migrate streams between real oasis-sim engines (in process):
// a proxy in front of one cuts or freezes its stream after some events, as
// a killed or SIGSTOPped engine would, and the client's stream must equal
// the uninterrupted one token for token.

// startSim serves an oasis-sim engine for model m.
func startSim(t *testing.T) string {
	t.Helper()
	s, err := simserver.New(simserver.Config{Model: "org/m", ServedModelNames: []string{"m"}, MaxModelLen: 4096,
		Version: "test", Engine: engine.Config{BlockSize: 16, NumGPUBlocks: 1000}})
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = s.Run(ctx); close(done) }()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		cancel()
		<-done
		_ = s.Close()
	})
	return addr(ts)
}

// faultyEngine relays the engine at target, and after `after` whole events
// of a stream (<0: never) fails as fail does; seen counts its requests and
// keeps the last body.
type faultyEngine struct {
	srv  *httptest.Server
	hits atomic.Int64
	last atomic.Value // string
}

func newFaultyEngine(t testing.TB, target string, after int, fail func(http.ResponseWriter, *http.Request)) *faultyEngine {
	t.Helper()
	f := &faultyEngine{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		body, _ := io.ReadAll(r.Body)
		f.last.Store(string(body))
		up, err := http.NewRequestWithContext(r.Context(), http.MethodPost, "http://"+target+r.URL.Path, strings.NewReader(string(body)))
		must.NoError(t, err)
		up.Header = r.Header.Clone()
		resp, err := http.DefaultTransport.RoundTrip(up)
		if err != nil {
			crash(w)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		br := bufio.NewReader(resp.Body)
		for events := 0; after < 0 || events < after; {
			line, err := br.ReadString('\n')
			_, _ = io.WriteString(w, line)
			if line == "\n" {
				events++
				w.(http.Flusher).Flush()
			}
			if err != nil {
				return
			}
		}
		fail(w, r)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func crashFault(w http.ResponseWriter, _ *http.Request) { crash(w) }

// engineHarness is newHarnessWith for engines of one kind (oasis_engine):
// id → "model@host:port".
func engineHarness(t testing.TB, c Config, kind string, doc *policy.Document, engines map[string]string) *harness {
	t.Helper()
	h := newHarnessWith(t, c, doc, nil)
	var ins []discovery.Instance
	for id, spec := range engines {
		model, a, _ := strings.Cut(spec, "@")
		ins = append(ins, discovery.Instance{ID: id, Address: a,
			Meta: map[string]string{discovery.MetaModel: model, discovery.MetaEngine: kind}})
	}
	h.pool.Set(ins)
	return h
}
func freezeFault(_ http.ResponseWriter, r *http.Request) { freeze(r) }

// streamed is a client stream read back.
type streamed struct {
	ids          map[string]bool
	roles        int
	text         string
	finish       string
	usage        *struct{ PromptTokens, CompletionTokens int64 }
	tokenMembers bool // token_ids or prompt_token_ids reached the client
	errorCode    string
	done         bool
}

func readStream(t *testing.T, resp *http.Response) streamed {
	t.Helper()
	must.EqOp(t, 200, resp.StatusCode)
	body := readAllString(t, resp)
	s := streamed{ids: map[string]bool{}}
	for _, ev := range strings.Split(body, "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		switch {
		case !ok:
			must.EqOp(t, "", ev, must.Sprintf("an event outside data: in %q", body))
			continue
		case data == "[DONE]":
			s.done = true
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Choices []struct {
				Text         string  `json:"text"`
				FinishReason *string `json:"finish_reason"`
				Delta        struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			} `json:"usage"`
			Error *struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		must.NoError(t, json.Unmarshal([]byte(data), &c), must.Sprintf("event %q", data))
		if c.Error != nil {
			s.errorCode = c.Error.Code
			continue
		}
		s.ids[c.ID] = true
		s.tokenMembers = s.tokenMembers || strings.Contains(data, "token_ids")
		if c.Usage != nil {
			s.usage = &struct{ PromptTokens, CompletionTokens int64 }{c.Usage.PromptTokens, c.Usage.CompletionTokens}
		}
		for _, ch := range c.Choices {
			if ch.Delta.Role != "" {
				s.roles++
			}
			s.text += ch.Text + ch.Delta.Content
			if ch.FinishReason != nil {
				s.finish = *ch.FinishReason
			}
		}
	}
	return s
}

var migrationRequests = []struct{ name, path, body string }{
	{"completions", "/v1/completions", `{"model":"m","prompt":"once upon a time","max_tokens":40,"seed":11,"stream":true,"stream_options":{"include_usage":true}}`},
	{"chat", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"tell me more"}],"temperature":0,"stream":true,"stream_options":{"include_usage":true}}`},
	{"chat without usage", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"go on"}],"max_tokens":30,"seed":2,"stream":true}`},
}

func migrationPolicy(idle string, limit int) *policy.Document {
	d := timeouts("5s", idle, "0s") // no hold: the role chunk is sent at once
	d.MigrationLimit = &limit
	return d
}

// A stream whose engine is killed after k events goes on on another engine:
// the client's stream equals the uninterrupted one (same seed), one id, one
// role chunk, usage for the whole answer, no router-added members.
func TestMigrationContinuesTokenExact(t *testing.T) {
	simA, simB := startSim(t), startSim(t)
	for _, rq := range migrationRequests {
		whole := newFaultyEngine(t, simA, -1, crashFault)
		h := engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(whole.srv)})
		want := readStream(t, h.post(rq.path, rq.body))
		must.True(t, want.done)
		must.False(t, want.tokenMembers)
		for _, after := range []int{1, 2, 7} {
			t.Run(rq.name+"/after "+string(rune('0'+after))+" events", func(t *testing.T) {
				bad := newFaultyEngine(t, simA, after, crashFault)
				good := newFaultyEngine(t, simB, -1, crashFault)
				h := engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
				got := readStream(t, h.post(rq.path, rq.body))
				must.EqOp(t, want.text, got.text)
				must.EqOp(t, want.finish, got.finish)
				must.Eq(t, want.usage, got.usage)
				must.MapLen(t, 1, got.ids)
				must.LessEq(t, 1, got.roles)
				must.False(t, got.tokenMembers)
				must.True(t, got.done)
				must.EqOp(t, "", got.errorCode)
				must.EqOp(t, int64(1), good.hits.Load())
				must.EqOp(t, 1.0, promtest.ToFloat64(h.m.Migrations.WithLabelValues("m", metrics.MigrationEngineFailed)))
				must.Positive(t, promtest.ToFloat64(h.m.MigrationResentTokens.WithLabelValues("m")))
				must.EqOp(t, 0.0, promtest.ToFloat64(h.m.StreamErrors.WithLabelValues("m", "upstream_broken")))
			})
		}
	}
}

// The continuation asks for the rest: max_tokens less what was sent, the
// ids so far as a completion's prompt, a chat's text as an open assistant
// message.
func TestMigrationContinuationRequest(t *testing.T) {
	simA, simB := startSim(t), startSim(t)
	bad := newFaultyEngine(t, simA, 4, crashFault) // 4 events: 4 tokens
	good := newFaultyEngine(t, simB, -1, crashFault)
	h := engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
	_ = readStream(t, h.post("/v1/completions", migrationRequests[0].body))
	var c struct {
		Prompt    []int32 `json:"prompt"`
		MaxTokens int     `json:"max_tokens"`
		IDs       bool    `json:"return_token_ids"`
	}
	must.NoError(t, json.Unmarshal([]byte(good.last.Load().(string)), &c))
	must.EqOp(t, 36, c.MaxTokens)
	must.True(t, c.IDs)
	prompt := tokenizer.EncodePrompt("once upon a time")
	must.SliceLen(t, len(prompt)+4, c.Prompt) // the prompt's ids, then the 4 tokens sent
	must.Eq(t, prompt, c.Prompt[:len(prompt)])

	bad = newFaultyEngine(t, simA, 3, crashFault) // role chunk + 2 tokens
	good = newFaultyEngine(t, simB, -1, crashFault)
	h = engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
	_ = readStream(t, h.post("/v1/chat/completions", migrationRequests[2].body))
	var cc struct {
		Messages             []struct{ Role, Content string } `json:"messages"`
		MaxTokens            int                              `json:"max_tokens"`
		ContinueFinalMessage bool                             `json:"continue_final_message"`
		AddGenerationPrompt  bool                             `json:"add_generation_prompt"`
	}
	must.NoError(t, json.Unmarshal([]byte(good.last.Load().(string)), &cc))
	must.EqOp(t, 28, cc.MaxTokens)
	must.True(t, cc.ContinueFinalMessage)
	must.False(t, cc.AddGenerationPrompt)
	must.SliceLen(t, 2, cc.Messages)
	must.EqOp(t, "assistant", cc.Messages[1].Role)
	must.StrHasPrefix(t, " ", cc.Messages[1].Content)
}

// Every engine failing: after migration_limit continuations the stream
// ends with the error event and [DONE]; nothing hangs. Limit 0 is today's
// behaviour.
func TestMigrationLimitEndsWithErrorEvent(t *testing.T) {
	sim := startSim(t)
	for _, limit := range []int{0, 1, 2} {
		t.Run("limit "+string(rune('0'+limit)), func(t *testing.T) {
			engines := map[string]string{}
			var fs []*faultyEngine
			for _, id := range []string{"a", "b", "c", "d"} {
				f := newFaultyEngine(t, sim, 2, crashFault)
				fs = append(fs, f)
				engines[id] = "m@" + addr(f.srv)
			}
			h := engineHarness(t, Config{}, "sim", migrationPolicy("5s", limit), engines)
			got := readStream(t, h.post("/v1/completions", migrationRequests[0].body))
			must.EqOp(t, "upstream_error", got.errorCode)
			must.True(t, got.done)
			must.MapLen(t, 1, got.ids)
			var hits int64
			for _, f := range fs {
				hits += f.hits.Load()
			}
			must.EqOp(t, int64(1+limit), hits)
			must.EqOp(t, float64(limit), promtest.ToFloat64(h.m.Migrations.WithLabelValues("m", metrics.MigrationEngineFailed)))
			must.EqOp(t, 1.0, promtest.ToFloat64(h.m.StreamErrors.WithLabelValues("m", "upstream_broken")))
			if limit > 0 {
				must.EqOp(t, 1.0, promtest.ToFloat64(h.m.MigrationsFailed.WithLabelValues("m", metrics.MigrationLimit)))
			}
		})
	}
}

// An engine that stalls (SIGSTOP) mid-stream is left after stream_idle and
// the stream goes on elsewhere, token-exact.
func TestMigrationAfterStall(t *testing.T) {
	simA, simB := startSim(t), startSim(t)
	rq := migrationRequests[1]
	whole := newFaultyEngine(t, simA, -1, crashFault)
	want := readStream(t, engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(whole.srv)}).post(rq.path, rq.body))
	bad := newFaultyEngine(t, simA, 5, freezeFault)
	good := newFaultyEngine(t, simB, -1, crashFault)
	h := engineHarness(t, Config{}, "sim", migrationPolicy("300ms", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
	got := readStream(t, h.post(rq.path, rq.body))
	must.EqOp(t, want.text, got.text)
	must.Eq(t, want.usage, got.usage)
	must.EqOp(t, "", got.errorCode)
	must.EqOp(t, 1.0, promtest.ToFloat64(h.m.Migrations.WithLabelValues("m", metrics.MigrationStreamIdle)))
	must.EqOp(t, 1.0, promtest.ToFloat64(h.m.UpstreamTimeouts.WithLabelValues("m", "stream_idle")))
}

// A client that asks for token ids itself gets them, the continuation's
// included, as one sequence: the uninterrupted answer's.
func TestMigrationKeepsClientTokenIDs(t *testing.T) {
	simA, simB := startSim(t), startSim(t)
	body := `{"model":"m","prompt":"abc","max_tokens":12,"seed":5,"stream":true,"return_token_ids":true}`
	ids := func(h *harness) []int32 {
		resp := h.post("/v1/completions", body)
		var out []int32
		for _, ev := range strings.Split(readAllString(t, resp), "\n\n") {
			data, _ := strings.CutPrefix(ev, "data: ")
			var c struct {
				Choices []struct {
					TokenIDs []int32 `json:"token_ids"`
				} `json:"choices"`
			}
			if json.Unmarshal([]byte(data), &c) == nil {
				for _, ch := range c.Choices {
					out = append(out, ch.TokenIDs...)
				}
			}
		}
		return out
	}
	whole := newFaultyEngine(t, simA, -1, crashFault)
	want := ids(engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(whole.srv)}))
	must.SliceLen(t, 12, want)
	bad := newFaultyEngine(t, simA, 5, crashFault)
	good := newFaultyEngine(t, simB, -1, crashFault)
	must.Eq(t, want, ids(engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})))
}

func TestRemoveMember(t *testing.T) {
	for _, tc := range []struct{ in, key, want string }{
		{`{"a":1,"token_ids":[1,2]}`, "token_ids", `{"a":1}`},
		{`{"token_ids":[1],"a":1}`, "token_ids", `{"a":1}`},
		{`{"prompt_token_ids":null,"choices":[{"text":"x","token_ids":[3]}]}`, "prompt_token_ids", `{"choices":[{"text":"x","token_ids":[3]}]}`},
		{`{"choices":[{"text":"\"token_ids\":[1]"}]}`, "token_ids", `{"choices":[{"text":"\"token_ids\":[1]"}]}`},
		{`{"a":{"token_ids":[1]},"b":{"token_ids":[2]}}`, "token_ids", `{"a":{},"b":{}}`},
	} {
		must.EqOp(t, tc.want, string(removeMember([]byte(tc.in), tc.key)))
	}
}

// scanChunk reads what encoding/json reads from the events it accepts, and
// declines the ones it cannot read exactly.
func TestScanChunk(t *testing.T) {
	for _, tc := range []struct {
		ev     string
		scans  bool
		prompt []int32
		ids    []int32
		out    string
		role   bool
		finish bool
		usage  string
	}{
		{`{"id":"cmpl-1","object":"text_completion","created":5,"model":"m","choices":[{"index":0,"text":" th","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":[1,2,3],"token_ids":[77]}]}`,
			true, []int32{1, 2, 3}, []int32{77}, " th", false, false, ""},
		{`{"id":"c","object":"chat.completion.chunk","created":5,"model":"m","prompt_token_ids":[9, 8],"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`,
			true, []int32{9, 8}, nil, "", true, false, ""},
		{`{"id":"c","created":5,"choices":[{"index":0,"delta":{"content":" e"},"logprobs":{"content":[{"token":"e","logprob":-0.1,"bytes":[101],"top_logprobs":[]}]},"finish_reason":"length","token_ids":[-1,2147483647]}]}`,
			true, nil, []int32{-1, 2147483647}, " e", false, true, ""},
		{`{"id":"c","created":5,"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`,
			true, nil, nil, "", false, false, `{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}`},
		{`{"id":"c","choices":[{"index":0,"delta":{"content":"a \"quote\""},"token_ids":[1]}]}`, false, nil, nil, "", false, false, ""},
		{`{"id":"c","choices":[{"index":0,"text":"a","token_ids":[1]},{"index":1,"text":"b","token_ids":[2]}]}`, false, nil, nil, "", false, false, ""},
		{`{"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"id":"x"}]},"token_ids":[1]}]}`, false, nil, nil, "", false, false, ""},
		{`{"id":"c","choices":[{"index":0,"text":"a","token_ids":["x"]}]}`, false, nil, nil, "", false, false, ""},
	} {
		var c streamChunk
		got := scanChunk([]byte(tc.ev), &c)
		must.EqOp(t, tc.scans, got, must.Sprint(tc.ev))
		if !got {
			continue
		}
		var want streamChunk
		must.NoError(t, json.Unmarshal([]byte(tc.ev), &want))
		must.Eq(t, tc.prompt, append(c.PromptTokenIDs, firstChoicePrompt(&c)...))
		must.EqOp(t, string(want.ID), string(c.ID))
		must.EqOp(t, string(want.Created), string(c.Created))
		must.EqOp(t, tc.usage, string(c.Usage))
		if len(want.Choices) == 0 {
			must.SliceEmpty(t, c.Choices)
			continue
		}
		ch := &c.Choices[0]
		must.Eq(t, tc.ids, ch.TokenIDs)
		must.Eq(t, want.Choices[0].TokenIDs, ch.TokenIDs)
		must.EqOp(t, tc.out, string(ch.output()))
		must.EqOp(t, string(want.Choices[0].output()), string(ch.output()))
		must.EqOp(t, tc.role, ch.Delta.Role != "")
		must.EqOp(t, tc.finish, ch.FinishReason != nil)
	}
}

func firstChoicePrompt(c *streamChunk) []int32 {
	if len(c.Choices) == 0 {
		return nil
	}
	return c.Choices[0].PromptTokenIDs
}

// The continuation is scored with its whole context: the prefix term (and
// the ttft term's uncached count) see the prompt's ids then the ids
// streamed, so an engine holding them is preferred.
func TestContinuationScoredWithItsTokens(t *testing.T) {
	body := `{"model":"m","prompt":"hi","max_tokens":10,"stream":true}`
	f, err := openai.ParseRequest(pathCompletions, []byte(body))
	must.NoError(t, err)
	x := &exchange{req: &scoring.Request{Model: "m", Path: pathCompletions, Body: []byte(body)}, fields: f, body: []byte(body),
		pol: policy.Resolved{MigrationLimit: 2}}
	tr := newStreamTrack(x, &scoring.Worker{Engine: engineVLLM})
	_ = tr.filter([]byte(`data: {"id":"a","created":1,"choices":[{"index":0,"text":" a","prompt_token_ids":[5,6],"token_ids":[7]}]}` + "\n\n" +
		`data: {"id":"a","created":1,"choices":[{"index":0,"text":"b","token_ids":[8]}]}` + "\n\n"))
	must.True(t, tr.continuable())
	next, err := tr.continuation(x)
	must.NoError(t, err)
	ids, err := next.req.PromptTokens(context.Background())
	must.NoError(t, err)
	must.Eq(t, []uint32{5, 6, 7, 8}, ids)
	must.EqOp(t, 8, next.fields.MaxTokens)
	must.StrContains(t, string(next.body), `"prompt":[5,6,7,8]`)
}

// A migrated stream's trace: the first engine's oasis.upstream span ends
// with its failure, the continuation is an oasis.migrate span (leg 1, the
// tokens it resent) under the same request span, on the new worker.
func TestMigrationSpans(t *testing.T) {
	sr := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(sr))
	simA, simB := startSim(t), startSim(t)
	bad := newFaultyEngine(t, simA, 3, crashFault)
	good := newFaultyEngine(t, simB, -1, crashFault)
	h := engineHarness(t, Config{TracerProvider: tp}, "sim", migrationPolicy("5s", 2),
		map[string]string{"a": "m@" + addr(bad.srv), "b": "m@" + addr(good.srv)})
	got := readStream(t, h.post("/v1/completions", migrationRequests[0].body))
	must.EqOp(t, "", got.errorCode)
	var upstream, migrate sdktrace.ReadOnlySpan
	for _, s := range sr.Ended() {
		switch s.Name() {
		case SpanUpstream:
			upstream = s
		case SpanMigrate:
			migrate = s
		}
	}
	must.NotNil(t, upstream)
	must.NotNil(t, migrate)
	must.EqOp(t, codes.Error, upstream.Status().Code)
	must.EqOp(t, codes.Unset, migrate.Status().Code)
	must.EqOp(t, upstream.Parent().SpanID(), migrate.Parent().SpanID())
	a := attrMap(migrate.Attributes())
	must.EqOp(t, "b", a[AttrWorker].AsString())
	must.EqOp(t, int64(1), a[AttrMigrationLeg].AsInt64())
	must.EqOp(t, int64(len(tokenizer.EncodePrompt("once upon a time"))+3), a[AttrResentTokens].AsInt64())
}

// Continuations that find no engine end the stream with the error event at
// once: the only engine failed (no_worker), or the others refuse
// connections (each refusal counts against migration_limit).
func TestMigrationWithoutAnEngineLeft(t *testing.T) {
	sim := startSim(t)
	for _, tc := range []struct {
		name, why string
		dead      int
	}{{"only engine", metrics.MigrationNoWorker, 0}, {"others dead", metrics.MigrationLimit, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			bad := newFaultyEngine(t, sim, 2, crashFault)
			engines := map[string]string{"a": "m@" + addr(bad.srv)}
			for i := range tc.dead {
				engines[string(rune('b'+i))] = "m@" + deadAddr(t)
			}
			h := engineHarness(t, Config{}, "sim", migrationPolicy("5s", 2), engines)
			got := readStream(t, h.post("/v1/completions", migrationRequests[0].body))
			must.EqOp(t, "upstream_error", got.errorCode)
			must.True(t, got.done)
			must.EqOp(t, 1.0, promtest.ToFloat64(h.m.MigrationsFailed.WithLabelValues("m", tc.why)))
			must.EqOp(t, float64(min(tc.dead, 2)), promtest.ToFloat64(h.m.Migrations.WithLabelValues("m", metrics.MigrationEngineFailed)))
		})
	}
}

// Only engines known to take token ids get return_token_ids: others may
// refuse an unknown field (TensorRT-LLM answers 400), and their streams
// keep the error event.
func TestTokenIDsOnlyToEnginesThatTakeThem(t *testing.T) {
	sim := startSim(t)
	for kind, want := range map[string]bool{"vllm": true, "sim": true, "trtllm": false, "llama_cpp": false, "sglang": false, "": false} {
		t.Run("engine "+kind, func(t *testing.T) {
			f := newFaultyEngine(t, sim, -1, crashFault)
			h := engineHarness(t, Config{}, kind, migrationPolicy("5s", 2), map[string]string{"a": "m@" + addr(f.srv)})
			got := readStream(t, h.post("/v1/completions", migrationRequests[0].body))
			must.True(t, got.done)
			must.False(t, got.tokenMembers)
			must.EqOp(t, want, strings.Contains(f.last.Load().(string), `"return_token_ids":true`))
		})
	}
}
