package server

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tokenizer"
	"github.com/oasis-llm/oasis/sim/engine"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/shoenig/test/must"
	"github.com/vmihailenco/msgpack/v5"
)

func startServer(t *testing.T, mod func(*Config)) (*Server, string) {
	t.Helper()
	cfg := Config{
		Model: "org/model", ServedModelNames: []string{"m"}, MaxModelLen: 4096, Speed: 0, Version: "test",
		Engine: engine.Config{BlockSize: 16, NumGPUBlocks: 1000},
	}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	s, err := New(cfg)
	must.NoError(t, err)
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(func() {
		ts.Close()
		cancel()
		<-done
		s.Close()
	})
	return s, ts.URL
}

func post(t *testing.T, url string, body any) (int, []byte) {
	t.Helper()
	var rd io.Reader
	switch b := body.(type) {
	case string:
		rd = strings.NewReader(b)
	default:
		rd = bytes.NewReader(mustJSON(b))
	}
	resp, err := http.Post(url, "application/json", rd)
	must.NoError(t, err)
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return resp.StatusCode, out
}

func decode[T any](t *testing.T, b []byte) T {
	t.Helper()
	var v T
	must.NoError(t, json.Unmarshal(b, &v), must.Sprintf("body %s", b))
	return v
}

type usageJSON struct {
	PromptTokens        int            `json:"prompt_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	PromptTokensDetails map[string]int `json:"prompt_tokens_details"`
}

type completionResp struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index        int     `json:"index"`
		Text         string  `json:"text"`
		FinishReason *string `json:"finish_reason"`
		StopReason   any     `json:"stop_reason"`
		Message      *struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Delta *struct {
			Role    *string `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Logprobs json.RawMessage `json:"logprobs"`
	} `json:"choices"`
	Usage            *usageJSON     `json:"usage"`
	KVTransferParams map[string]any `json:"kv_transfer_params"`
}

func TestCompletionNonStreaming(t *testing.T) {
	_, url := startServer(t, nil)
	code, body := post(t, url+"/v1/completions", map[string]any{"model": "m", "prompt": "Hello there", "max_tokens": 7})
	must.Eq(t, 200, code)
	r := decode[completionResp](t, body)
	must.Eq(t, "text_completion", r.Object)
	must.StrHasPrefix(t, "cmpl-", r.ID)
	must.Eq(t, "m", r.Model)
	must.Len(t, 1, r.Choices)
	must.Eq(t, "length", *r.Choices[0].FinishReason)
	must.Eq(t, len(tokenizer.EncodePrompt("Hello there")), r.Usage.PromptTokens)
	must.Eq(t, 7, r.Usage.CompletionTokens)
	must.Eq(t, r.Usage.PromptTokens+7, r.Usage.TotalTokens)
	// The text is exactly the 7 generated tokens.
	must.StrHasPrefix(t, " ", r.Choices[0].Text)
}

// sse splits an SSE body into its data payloads, checking the framing.
func sse(t *testing.T, body []byte) []string {
	t.Helper()
	s := string(body)
	must.StrHasSuffix(t, "data: [DONE]\n\n", s)
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(s, "\n\n"), "\n\n") {
		must.StrHasPrefix(t, "data: ", ev)
		must.StrNotContains(t, ev, "\n")
		out = append(out, strings.TrimPrefix(ev, "data: "))
	}
	return out
}

func TestChatStreamingSSE(t *testing.T) {
	_, url := startServer(t, nil)
	req := map[string]any{"model": "m", "messages": []any{map[string]any{"role": "user", "content": "Tell me"}},
		"max_tokens": 12, "seed": 7, "stream": true, "stream_options": map[string]any{"include_usage": true}}
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(mustJSON(req)))
	must.NoError(t, err)
	must.Eq(t, "text/event-stream; charset=utf-8", resp.Header.Get("Content-Type"))
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	events := sse(t, body)
	must.Eq(t, "[DONE]", events[len(events)-1])
	chunks := events[:len(events)-1]
	first := decode[completionResp](t, []byte(chunks[0]))
	must.Eq(t, "chat.completion.chunk", first.Object)
	must.Eq(t, "assistant", *first.Choices[0].Delta.Role)
	var text strings.Builder
	var finish string
	for _, c := range chunks[1 : len(chunks)-1] {
		r := decode[completionResp](t, []byte(c))
		must.Eq(t, first.ID, r.ID)
		must.Nil(t, r.Usage)
		must.Len(t, 1, r.Choices)
		text.WriteString(*r.Choices[0].Delta.Content)
		if r.Choices[0].FinishReason != nil {
			finish = *r.Choices[0].FinishReason
		}
	}
	must.Eq(t, "length", finish)
	last := decode[completionResp](t, []byte(chunks[len(chunks)-1]))
	must.Len(t, 0, last.Choices)
	msgs := []tokenizer.Message{{Role: "user", Content: "Tell me"}}
	must.Eq(t, len(tokenizer.EncodeChat(msgs, true)), last.Usage.PromptTokens)
	must.Eq(t, 12, last.Usage.CompletionTokens)

	// Same request without streaming and the same seed: same text.
	delete(req, "stream")
	delete(req, "stream_options")
	code, body := post(t, url+"/v1/chat/completions", req)
	must.Eq(t, 200, code)
	full := decode[completionResp](t, body)
	must.Eq(t, "chat.completion", full.Object)
	must.Eq(t, text.String(), full.Choices[0].Message.Content)
	must.Eq(t, "assistant", full.Choices[0].Message.Role)
}

func TestCompletionStreamingNoUsageByDefault(t *testing.T) {
	_, url := startServer(t, nil)
	code, body := post(t, url+"/v1/completions", map[string]any{"model": "m", "prompt": "abc", "max_tokens": 3, "stream": true})
	must.Eq(t, 200, code)
	events := sse(t, body)
	must.Len(t, 4, events) // 3 tokens + [DONE]
	for _, e := range events[:3] {
		r := decode[completionResp](t, []byte(e))
		must.Eq(t, "text_completion", r.Object)
		must.Nil(t, r.Usage)
	}
}

func TestSeedDeterminism(t *testing.T) {
	_, url := startServer(t, nil)
	get := func(seed int) string {
		_, body := post(t, url+"/v1/completions", map[string]any{"prompt": "same prompt", "max_tokens": 20, "seed": seed})
		return decode[completionResp](t, body).Choices[0].Text
	}
	must.Eq(t, get(1), get(1))
	must.NotEq(t, get(1), get(2))
}

func TestStopString(t *testing.T) {
	_, url := startServer(t, nil)
	_, body := post(t, url+"/v1/completions", map[string]any{"prompt": "p", "max_tokens": 60, "seed": 3})
	full := decode[completionResp](t, body).Choices[0].Text
	// Stop on a word that occurs in the seeded output.
	words := strings.Fields(full)
	stop := words[len(words)/2]
	_, body = post(t, url+"/v1/completions", map[string]any{"prompt": "p", "max_tokens": 60, "seed": 3, "stop": []string{stop}})
	r := decode[completionResp](t, body)
	c := r.Choices[0]
	must.Eq(t, "stop", *c.FinishReason)
	must.Eq(t, any(stop), c.StopReason)
	must.Eq(t, full[:strings.Index(full, stop)], c.Text)
	must.Less(t, 60, r.Usage.CompletionTokens)

	// Streaming gives the same text.
	_, body = post(t, url+"/v1/completions", map[string]any{"prompt": "p", "max_tokens": 60, "seed": 3, "stop": stop, "stream": true})
	var text strings.Builder
	for _, e := range sse(t, body) {
		if e != "[DONE]" {
			text.WriteString(decode[completionResp](t, []byte(e)).Choices[0].Text)
		}
	}
	must.Eq(t, c.Text, text.String())
}

func TestNaturalEndWithoutMaxTokens(t *testing.T) {
	_, url := startServer(t, nil)
	_, body := post(t, url+"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}})
	r := decode[completionResp](t, body)
	must.Eq(t, "stop", *r.Choices[0].FinishReason)
	must.Between(t, 16, r.Usage.CompletionTokens, 271)
	must.StrNotContains(t, r.Choices[0].Message.Content, "<|eot_id|>")
}

func TestLogprobs(t *testing.T) {
	_, url := startServer(t, nil)
	_, body := post(t, url+"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}},
		"max_tokens": 4, "logprobs": true, "top_logprobs": 3})
	var chat struct {
		Choices []struct {
			Logprobs struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					Bytes       []int   `json:"bytes"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
			Message struct{ Content string } `json:"message"`
		} `json:"choices"`
	}
	must.NoError(t, json.Unmarshal(body, &chat))
	lp := chat.Choices[0].Logprobs.Content
	must.Len(t, 4, lp)
	var joined string
	for _, e := range lp {
		must.LessEq(t, 0.0, e.Logprob)
		must.Len(t, 3, e.TopLogprobs)
		must.Eq(t, e.Token, e.TopLogprobs[0].Token)
		must.Greater(t, e.TopLogprobs[1].Logprob, e.TopLogprobs[0].Logprob)
		must.Eq(t, len(e.Token), len(e.Bytes))
		joined += e.Token
	}
	must.Eq(t, chat.Choices[0].Message.Content, joined)

	_, body = post(t, url+"/v1/completions", map[string]any{"prompt": "x", "max_tokens": 5, "logprobs": 2})
	var comp struct {
		Choices []struct {
			Text     string `json:"text"`
			Logprobs struct {
				Tokens        []string             `json:"tokens"`
				TokenLogprobs []float64            `json:"token_logprobs"`
				TextOffset    []int                `json:"text_offset"`
				TopLogprobs   []map[string]float64 `json:"top_logprobs"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	must.NoError(t, json.Unmarshal(body, &comp))
	l := comp.Choices[0].Logprobs
	must.Len(t, 5, l.Tokens)
	must.Len(t, 5, l.TokenLogprobs)
	must.Len(t, 5, l.TopLogprobs)
	must.Eq(t, 0, l.TextOffset[0])
	must.Eq(t, comp.Choices[0].Text, strings.Join(l.Tokens, ""))
	for _, m := range l.TopLogprobs {
		must.MapLen(t, 2, m)
	}
}

func TestErrors(t *testing.T) {
	_, url := startServer(t, func(c *Config) { c.MaxModelLen = 64 })
	long := strings.Repeat("word ", 100)
	cases := []struct {
		name, path string
		body       any
		status     int
		typ        string
		contains   string
	}{
		{"unknown model", "/v1/completions", map[string]any{"model": "nope", "prompt": "x"}, 404, "NotFoundError", "does not exist"},
		{"unknown model chat", "/v1/chat/completions", map[string]any{"model": "nope", "messages": []any{map[string]any{"role": "user", "content": "x"}}}, 404, "NotFoundError", "nope"},
		{"malformed json", "/v1/completions", `{"prompt":`, 400, "BadRequestError", "invalid JSON"},
		{"wrong type", "/v1/completions", `{"prompt": 5}`, 400, "BadRequestError", "prompt"},
		{"over-long prompt", "/v1/completions", map[string]any{"prompt": long}, 400, "BadRequestError", "maximum context length is 64"},
		{"prompt+max_tokens too long", "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 100}, 400, "BadRequestError", "maximum context length is 64"},
		{"max_tokens zero", "/v1/completions", map[string]any{"prompt": "hi", "max_tokens": 0}, 400, "BadRequestError", "max_tokens"},
		{"n=2", "/v1/completions", map[string]any{"prompt": "hi", "n": 2}, 400, "BadRequestError", "n=1"},
		{"stream_options without stream", "/v1/completions", map[string]any{"prompt": "hi", "stream_options": map[string]any{"include_usage": true}}, 400, "BadRequestError", "stream"},
		{"empty messages", "/v1/chat/completions", map[string]any{"messages": []any{}}, 400, "BadRequestError", "messages"},
		{"bad token id", "/v1/completions", map[string]any{"prompt": []int{-1}}, 400, "BadRequestError", "out of vocabulary"},
		{"top_logprobs range", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}}, "logprobs": true, "top_logprobs": 21}, 400, "BadRequestError", "top_logprobs"},
		{"tokenize unknown model", "/tokenize", map[string]any{"model": "x", "prompt": "a"}, 404, "NotFoundError", "x"},
		{"detokenize bad id", "/detokenize", map[string]any{"tokens": []int{tokenizer.VocabSize}}, 400, "BadRequestError", "vocabulary"},
		{"unknown path", "/v1/nothing", map[string]any{}, 404, "NotFoundError", "Not Found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, body := post(t, url+c.path, c.body)
			must.Eq(t, c.status, code, must.Sprintf("body %s", body))
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   any    `json:"param"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			must.NoError(t, json.Unmarshal(body, &e))
			must.Eq(t, c.typ, e.Error.Type)
			must.Eq(t, c.status, e.Error.Code)
			must.StrContains(t, e.Error.Message, c.contains)
			var raw map[string]map[string]any
			must.NoError(t, json.Unmarshal(body, &raw))
			for _, k := range []string{"message", "type", "param", "code"} {
				_, ok := raw["error"][k]
				must.True(t, ok, must.Sprintf("error.%s missing", k))
			}
		})
	}
}

func TestTokenizeDetokenize(t *testing.T) {
	_, url := startServer(t, nil)
	type tokResp struct {
		Count       int     `json:"count"`
		MaxModelLen int     `json:"max_model_len"`
		Tokens      []int32 `json:"tokens"`
	}
	code, body := post(t, url+"/tokenize", map[string]any{"model": "m", "prompt": "hello world"})
	must.Eq(t, 200, code)
	r := decode[tokResp](t, body)
	must.Eq(t, tokenizer.EncodePrompt("hello world"), r.Tokens)
	must.Eq(t, len(r.Tokens), r.Count)
	must.Eq(t, 4096, r.MaxModelLen)

	_, body = post(t, url+"/tokenize", map[string]any{"prompt": "hello world", "add_special_tokens": false})
	must.Eq(t, tokenizer.Encode(nil, "hello world"), decode[tokResp](t, body).Tokens)

	msgs := []any{map[string]any{"role": "system", "content": "s"}, map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "a"}, map[string]any{"type": "text", "text": "b"}}}}
	_, body = post(t, url+"/tokenize", map[string]any{"messages": msgs})
	want := tokenizer.EncodeChat([]tokenizer.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "a\nb"}}, true)
	must.Eq(t, want, decode[tokResp](t, body).Tokens)

	// The chat endpoint computes exactly the tokens /tokenize returns.
	_, body = post(t, url+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 1})
	must.Eq(t, len(want), decode[completionResp](t, body).Usage.PromptTokens)

	_, body = post(t, url+"/detokenize", map[string]any{"tokens": want})
	must.Eq(t, tokenizer.RenderChat([]tokenizer.Message{{Role: "system", Content: "s"}, {Role: "user", Content: "a\nb"}}, true),
		decode[map[string]string](t, body)["prompt"])
}

func TestModelsHealthVersion(t *testing.T) {
	_, url := startServer(t, nil)
	resp, err := http.Get(url + "/health")
	must.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	must.Len(t, 0, b)
	resp, err = http.Get(url + "/v1/models")
	must.NoError(t, err)
	var models struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			Root        string `json:"root"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&models))
	resp.Body.Close()
	must.Eq(t, "list", models.Object)
	must.Eq(t, "m", models.Data[0].ID)
	must.Eq(t, "org/model", models.Data[0].Root)
	must.Eq(t, 4096, models.Data[0].MaxModelLen)
}

func scrape(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(resp.Body)
	must.NoError(t, err)
	return mfs
}

func value(t *testing.T, mfs map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	mf, ok := mfs[name]
	must.True(t, ok, must.Sprintf("metric %s missing", name))
	var sum float64
	for _, m := range mf.GetMetric() {
		switch {
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

func TestMetrics(t *testing.T) {
	_, url := startServer(t, nil)
	prompt := strings.Repeat("a shared system prompt of some length ", 20)
	for range 2 {
		code, _ := post(t, url+"/v1/completions", map[string]any{"prompt": prompt, "max_tokens": 5})
		must.Eq(t, 200, code)
	}
	n := len(tokenizer.EncodePrompt(prompt))
	mfs := scrape(t, url)
	must.Eq(t, dto.MetricType_COUNTER, mfs["vllm:prefix_cache_queries_total"].GetType())
	must.Eq(t, float64(2*n), value(t, mfs, "vllm:prefix_cache_queries_total"))
	must.Eq(t, float64((n-1)/16*16), value(t, mfs, "vllm:prefix_cache_hits_total"))
	must.Eq(t, float64(2*n), value(t, mfs, "vllm:prompt_tokens_total"))
	must.Eq(t, 10.0, value(t, mfs, "vllm:generation_tokens_total"))
	must.Eq(t, 2.0, value(t, mfs, "vllm:request_success_total"))
	must.Eq(t, 2.0, value(t, mfs, "vllm:time_to_first_token_seconds"))
	must.Eq(t, 2.0, value(t, mfs, "vllm:e2e_request_latency_seconds"))
	must.Eq(t, 8.0, value(t, mfs, "vllm:inter_token_latency_seconds"))
	must.Eq(t, 0.0, value(t, mfs, "vllm:num_requests_running"))
	must.Eq(t, 0.0, value(t, mfs, "vllm:num_requests_waiting"))
	must.Eq(t, 0.0, value(t, mfs, "vllm:kv_cache_usage_perc"))
	must.Positive(t, value(t, mfs, "oasis_sim_power_watts"))
	for _, m := range mfs["vllm:num_requests_running"].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		must.Eq(t, "m", labels["model_name"])
	}
}

// streamFirstChunk starts a streaming completion and returns the time to its first
// token chunk, plus a cancel func and the body reader.
func timeToFirstToken(t *testing.T, url string, prompt []int32) time.Duration {
	t.Helper()
	start := time.Now()
	resp, err := http.Post(url+"/v1/completions", "application/json",
		bytes.NewReader(mustJSON(map[string]any{"prompt": prompt, "max_tokens": 2, "stream": true})))
	must.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	must.NoError(t, err)
	ttft := time.Since(start)
	must.StrHasPrefix(t, "data: {", line)
	_, _ = io.Copy(io.Discard, br)
	return ttft
}

// At speed 1 a prompt served from the prefix cache gets its first token sooner than
// the same-length uncached prompt (the step time counts only uncached tokens).
func TestCachedPromptTTFTLower(t *testing.T) {
	_, url := startServer(t, func(c *Config) {
		c.Speed = 1
		c.MaxModelLen = 8192
		c.Engine.Timing = engine.Timing{StepBase: time.Millisecond, PerPrefillToken: 20 * time.Microsecond, PerDecodeSeq: 0}
	})
	mk := func(base int32) []int32 {
		p := make([]int32, 4000)
		for i := range p {
			p[i] = base + int32(i)
		}
		return p
	}
	warm := mk(1000)
	timeToFirstToken(t, url, warm) // populate the cache
	cached := timeToFirstToken(t, url, warm)
	uncached := timeToFirstToken(t, url, mk(100000))
	// Modelled: 4000 tokens × 20µs = 80ms uncached versus ~1ms cached.
	must.Less(t, uncached, cached, must.Sprintf("cached %v, uncached %v", cached, uncached))
}

// A client that goes away mid-stream aborts its request and frees its blocks.
func TestClientDisconnectFreesBlocks(t *testing.T) {
	s, url := startServer(t, func(c *Config) { c.Speed = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions",
		bytes.NewReader(mustJSON(map[string]any{"prompt": strings.Repeat("x y ", 100), "max_tokens": 2000, "stream": true})))
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	br := bufio.NewReader(resp.Body)
	_, err = br.ReadString('\n')
	must.NoError(t, err)
	st, _ := s.snapshot()
	must.Eq(t, 1, st.Running)
	must.Positive(t, st.UsedBlocks)
	cancel()
	resp.Body.Close()
	testutil.Eventually(t, 10*time.Second, "blocks freed after disconnect", func() bool {
		st, _ = s.snapshot()
		return st.Running == 0 && st.UsedBlocks == 0
	})
	mfs := scrape(t, url)
	must.Eq(t, 1.0, metricWithLabel(t, mfs, "vllm:request_success_total", "finished_reason", "abort"))
}

func metricWithLabel(t *testing.T, mfs map[string]*dto.MetricFamily, name, label, val string) float64 {
	for _, m := range mfs[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == val {
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("%s{%s=%q} missing", name, label, val)
	return 0
}

// KV events leave the server in vLLM's wire format and decode with plain structs.
func TestKVEventsOverZMQ(t *testing.T) {
	s, url := startServer(t, func(c *Config) {
		c.KVEvents = &kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", Topic: "kv-events"}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	must.NoError(t, sub.Dial("tcp://"+s.KVEventsAddr().String()))
	must.NoError(t, sub.SetOption(zmq4.OptionSubscribe, "kv-events"))
	got := make(chan zmq4.Msg, 16)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			got <- m
		}
	}()
	type storedEvent struct {
		Type            string   `msgpack:"type"`
		BlockHashes     []uint64 `msgpack:"block_hashes"`
		ParentBlockHash *uint64  `msgpack:"parent_block_hash"`
		TokenIDs        []int32  `msgpack:"token_ids"`
		BlockSize       int      `msgpack:"block_size"`
		Medium          string   `msgpack:"medium"`
	}
	type batch struct {
		//lint:ignore U1000 read by msgpack through reflection: decode the array as a struct
		_msgpack struct{} `msgpack:",as_array"`
		TS       float64
		Events   []msgpack.RawMessage
		Rank     *int
	}
	// Send distinct prompts until one's events arrive (the ZMQ slow joiner drops the
	// first messages while the subscription propagates).
	for i := 0; ; i++ {
		text := strconv.Itoa(i) + strings.Repeat(" block of text", 10)
		code, _ := post(t, url+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 1})
		must.Eq(t, 200, code)
		select {
		case m := <-got:
			must.Len(t, 3, m.Frames)
			must.Eq(t, "kv-events", string(m.Frames[0]))
			var b batch
			must.NoError(t, msgpack.Unmarshal(m.Frames[2], &b))
			var ev storedEvent
			must.NoError(t, msgpack.Unmarshal(b.Events[0], &ev))
			must.Eq(t, "BlockStored", ev.Type)
			must.Eq(t, 16, ev.BlockSize)
			must.Eq(t, "GPU", ev.Medium)
			must.Nil(t, ev.ParentBlockHash)
			// The router can recompute its own keys: token ids are the prompt's.
			p := tokenizer.EncodePrompt(text)
			must.Eq(t, p[:len(ev.TokenIDs)], ev.TokenIDs)
			must.Eq(t, len(p)/16, len(ev.BlockHashes))
			must.Eq(t, engine.BlockHash(0, false, p[:16]), ev.BlockHashes[0])
			return
		case <-time.After(100 * time.Millisecond):
		}
		if ctx.Err() != nil {
			t.Fatal("no KV events received")
		}
	}
}

// BenchmarkStreamingCompletion drives the server in-process over loopback HTTP with
// 128-token prompts and 16 output tokens at speed 0 (see sim/simload for the
// out-of-process benchmark recorded in BENCHMARKS.md).
func BenchmarkStreamingCompletion(b *testing.B) {
	s, err := New(Config{Model: "m", MaxModelLen: 4096, Engine: engine.Config{BlockSize: 16, NumGPUBlocks: 20000}})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	ts := httptest.NewServer(s.Handler())
	defer ts.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	b.SetParallelism(16)
	var seq atomic.Int64
	b.RunParallel(func(pb *testing.PB) {
		prompt := make([]int32, 128)
		for pb.Next() {
			base := int32(seq.Add(1)) * 128
			for i := range prompt {
				prompt[i] = base + int32(i)
			}
			resp, err := client.Post(ts.URL+"/v1/completions", "application/json",
				bytes.NewReader(mustJSON(map[string]any{"prompt": prompt, "max_tokens": 16, "stream": true})))
			if err != nil {
				b.Error(err)
				return
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
}

func TestParseIntArray(t *testing.T) {
	cases := []struct {
		in   string
		want []int32
		ok   bool
	}{
		{"[1,2,3]", []int32{1, 2, 3}, true},
		{" [ 10 , 0 ] ", []int32{10, 0}, true},
		{"[]", []int32{}, true},
		{"[1,]", nil, false},
		{"[-1]", nil, false},
		{"[1.5]", nil, false},
		{"[1] x", nil, false},
		{"[99999999999]", nil, false},
	}
	for _, c := range cases {
		got, ok := parseIntArray([]byte(c.in))
		must.Eq(t, c.ok, ok, must.Sprint(c.in))
		if ok {
			must.Eq(t, c.want, got)
		}
	}
}

func TestAPIKey(t *testing.T) {
	_, url := startServer(t, func(c *Config) { c.APIKey = "s3cret" })
	body := `{"prompt":"x","max_tokens":1}`
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, 401, resp.StatusCode)
	req, _ := http.NewRequest("POST", url+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer s3cret")
	resp, err = http.DefaultClient.Do(req)
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	// Health and metrics stay open, as in vLLM.
	resp, err = http.Get(url + "/health")
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
}

func TestCompletionsDefaultMaxTokens(t *testing.T) {
	_, url := startServer(t, nil)
	_, body := post(t, url+"/v1/completions", map[string]any{"prompt": "x"})
	r := decode[completionResp](t, body)
	must.Eq(t, 16, r.Usage.CompletionTokens)
	must.Eq(t, "length", *r.Choices[0].FinishReason)
}

func TestCPUTierMetrics(t *testing.T) {
	_, url := startServer(t, func(c *Config) { c.Engine.CPUBlocks = 100 })
	code, _ := post(t, url+"/v1/completions", map[string]any{"prompt": strings.Repeat("offload me ", 20), "max_tokens": 1})
	must.Eq(t, 200, code)
	mfs := scrape(t, url)
	must.Positive(t, value(t, mfs, "oasis_sim_cpu_cached_blocks"))
	must.Eq(t, 0.0, value(t, mfs, "oasis_sim_cpu_cache_hits_total"))
}

func TestStreamingLogprobsAndContinuousUsage(t *testing.T) {
	_, url := startServer(t, nil)
	_, body := post(t, url+"/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user", "content": "x"}},
		"max_tokens": 3, "stream": true, "logprobs": true, "top_logprobs": 2,
		"stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true}})
	events := sse(t, body)
	must.Len(t, 6, events) // role chunk, 3 tokens, usage chunk, [DONE]
	for i, e := range events[1:4] {
		var c struct {
			Choices []struct {
				Logprobs struct {
					Content []struct {
						TopLogprobs []any `json:"top_logprobs"`
					} `json:"content"`
				} `json:"logprobs"`
			} `json:"choices"`
			Usage usageJSON `json:"usage"`
		}
		must.NoError(t, json.Unmarshal([]byte(e), &c))
		must.Len(t, 1, c.Choices[0].Logprobs.Content)
		must.Len(t, 2, c.Choices[0].Logprobs.Content[0].TopLogprobs)
		must.Eq(t, i+1, c.Usage.CompletionTokens)
	}
}
