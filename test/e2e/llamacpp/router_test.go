package llamacpp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/app"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/tokens"
)

// startRouter runs the router (router/app, as cmd/oasis-router assembles it) with
// Consul discovery of this package's engines and a fixed policy document; it returns
// the router's base URL once it serves model. Start it after the engines pass their
// checks: its first look at Consul then finds them all.
func startRouter(t testing.TB, doc *policy.Document, model string) string {
	t.Helper()
	data, err := json.Marshal(doc)
	must.NoError(t, err)
	pol := filepath.Join(t.TempDir(), "policy.json")
	must.NoError(t, os.WriteFile(pol, data, 0o600))
	t.Setenv("CONSUL_HTTP_TOKEN", stack.ConsulToken)
	listen := testutil.FreeAddr(t)
	a, err := app.New(app.Config{Listen: listen, Discovery: app.DiscoveryConsul, ConsulAddr: stack.ConsulAddr,
		ServiceTag: engineTag, PolicyFile: pol, ScrapeInterval: time.Second, ShutdownTimeout: 5 * time.Second,
		Registry: prometheus.NewRegistry(),
		Logger:   hclog.New(&hclog.LoggerOptions{Name: "router", Level: hclog.Warn, Output: testWriter{t}})})
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	url := "http://" + listen
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "the router's /v1/models to list the model", func() bool {
		code, b, err := get(url + "/v1/models")
		return err == nil && code == http.StatusOK && strings.Contains(string(b), `"`+model+`"`)
	})
	return url
}

// testWriter sends router logs to the test's log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// chatAnswer is what the tests read of an OpenAI chat or completion answer, with
// llama-server's own timings (cache_n: prompt tokens taken from the slot's cache).
type chatAnswer struct {
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"message"`
		Text         string `json:"text"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Timings struct {
		CacheN  int `json:"cache_n"`
		PromptN int `json:"prompt_n"`
	} `json:"timings"`
}

// sse reads a streamed answer: the data payloads up to [DONE], which it requires.
func sse(t *testing.T, resp *http.Response) []string {
	t.Helper()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.StrHasPrefix(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var data []string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	done := false
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "data: ") {
			continue
		}
		p := strings.TrimPrefix(line, "data: ")
		if p == "[DONE]" {
			done = true
			break
		}
		data = append(data, p)
	}
	must.NoError(t, sc.Err())
	must.True(t, done, must.Sprint("the stream ended without data: [DONE]"))
	return data
}

// Chat and completions through the router to real llama-server engines, streaming and
// not: OpenAI shapes, usage that adds up, max_tokens honoured, the model's own name, and
// llama-server's error for a prompt over its context reaching the client as an OpenAI
// error with the engine's status; stop strings and logprobs as llama-server gives them.
func TestRouterServesLlamaServer(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	const model = "tiny-router"
	runEngines(t, ctx, "llama-router", model, 2)
	url := startRouter(t, policy.Default(), model)

	var chat chatAnswer
	code, b := post(t, url+"/v1/chat/completions",
		`{"model":"tiny-router","max_tokens":6,"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is Oasis?"}]}`, &chat)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	must.Eq(t, "chat.completion", chat.Object)
	must.Len(t, 1, chat.Choices)
	must.Eq(t, "assistant", chat.Choices[0].Message.Role)
	must.Eq(t, "length", chat.Choices[0].FinishReason)
	must.Eq(t, 6, chat.Usage.CompletionTokens)
	must.Positive(t, chat.Usage.PromptTokens)
	must.Eq(t, chat.Usage.PromptTokens+chat.Usage.CompletionTokens, chat.Usage.TotalTokens)

	var cmpl chatAnswer
	code, b = post(t, url+"/v1/completions", `{"model":"tiny-router","max_tokens":4,"prompt":"Nomad schedules"}`, &cmpl)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	must.Eq(t, "text_completion", cmpl.Object)
	must.Len(t, 1, cmpl.Choices)
	must.Eq(t, 4, cmpl.Usage.CompletionTokens)

	// Streaming chat, with usage in the last chunk as stream_options asks.
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"tiny-router","max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Stream, please."}]}`))
	must.NoError(t, err)
	chunks := sse(t, resp)
	resp.Body.Close()
	must.Greater(t, 2, len(chunks))
	var content strings.Builder
	var usage chatAnswer
	for _, c := range chunks {
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		must.NoError(t, json.Unmarshal([]byte(c), &ch), must.Sprintf("chunk %s", c))
		must.Eq(t, "chat.completion.chunk", ch.Object)
		for _, c := range ch.Choices {
			content.WriteString(c.Delta.Content)
		}
		var u chatAnswer
		if json.Unmarshal([]byte(c), &u) == nil && u.Usage.TotalTokens > 0 {
			usage = u
		}
	}
	must.Eq(t, 8, usage.Usage.CompletionTokens, must.Sprintf("chunks: %v", chunks))
	must.NotEq(t, "", content.String())

	// Streaming completions.
	resp, err = http.Post(url+"/v1/completions", "application/json", strings.NewReader(
		`{"model":"tiny-router","max_tokens":5,"stream":true,"prompt":"Consul registers"}`))
	must.NoError(t, err)
	chunks = sse(t, resp)
	resp.Body.Close()
	must.Positive(t, len(chunks))

	// A prompt longer than the slot's context: llama-server's 400, an OpenAI error.
	long := strings.Repeat("overflow the context window ", 2000)
	code, b = post(t, url+"/v1/completions", `{"model":"tiny-router","max_tokens":4,"prompt":"`+long+`"}`, nil)
	must.Eq(t, http.StatusBadRequest, code, must.Sprintf("%.300s", b))
	var e struct {
		Error struct {
			Message string `json:"message"`
			Type    string `json:"type"`
		} `json:"error"`
	}
	must.NoError(t, json.Unmarshal(b, &e), must.Sprintf("%s", b))
	must.NotEq(t, "", e.Error.Message)
	must.NotEq(t, "", e.Error.Type)
	t.Logf("over-context error through the router: %d %s", code, b)

	t.Run("stop", func(t *testing.T) { stopThroughRouter(t, url) })
	t.Run("logprobs", func(t *testing.T) { logprobsThroughRouter(t, url) })
}

// stopThroughRouter: a stop string ends the answer before it, with finish_reason "stop". The
// answer is greedy (temperature 0), so a first request tells which text follows.
func stopThroughRouter(t *testing.T, url string) {
	const body = `{"model":"tiny-router","max_tokens":12,"temperature":0,"prompt":"Nomad and Consul"%s}`
	var free chatAnswer
	code, b := post(t, url+"/v1/completions", fmt.Sprintf(body, ""), &free)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	text := free.Choices[0].Text
	// A stop string from the middle of the greedy answer, not at its start.
	fields := strings.Fields(text)
	must.Greater(t, 2, len(fields), must.Sprintf("answer %q", text))
	stop := fields[len(fields)/2]
	want, _, _ := strings.Cut(text, stop)
	var stopped chatAnswer
	code, b = post(t, url+"/v1/completions", fmt.Sprintf(body, `,"stop":[`+strconv.Quote(stop)+`]`), &stopped)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	must.Eq(t, want, stopped.Choices[0].Text, must.Sprintf("stop %q in %q", stop, text))
	must.Eq(t, "stop", stopped.Choices[0].FinishReason)
	must.Less(t, free.Usage.CompletionTokens, stopped.Usage.CompletionTokens)
}

// logprobsThroughRouter: a chat asking for logprobs gets llama-server's, in OpenAI's shape,
// one entry per generated token with the top alternatives asked for.
func logprobsThroughRouter(t *testing.T, url string) {
	var out struct {
		Choices []struct {
			Logprobs *struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	code, b := post(t, url+"/v1/chat/completions",
		`{"model":"tiny-router","max_tokens":4,"logprobs":true,"top_logprobs":2,"messages":[{"role":"user","content":"Log the odds."}]}`, &out)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	must.Len(t, 1, out.Choices)
	must.NotNil(t, out.Choices[0].Logprobs, must.Sprintf("%s", b))
	must.Len(t, 4, out.Choices[0].Logprobs.Content)
	for _, c := range out.Choices[0].Logprobs.Content {
		must.LessEq(t, 0.0, c.Logprob)
		must.Len(t, 2, c.TopLogprobs)
	}
}

// A client that goes away mid-stream frees its llama-server slot: the router cancels
// the upstream request and the engine stops generating long before max_tokens.
func TestClientCancelFreesSlot(t *testing.T) {
	ctx := ctxT(t, 3*time.Minute)
	const model = "tiny-cancel"
	addrs := runEngines(t, ctx, "llama-cancel", model, 1)
	url := startRouter(t, policy.Default(), model)
	before := scrape(t, addrs[0])

	const maxTokens = 1500
	rctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, url+"/v1/completions", strings.NewReader(
		fmt.Sprintf(`{"model":%q,"max_tokens":%d,"stream":true,"prompt":"Generate until the client leaves"}`, model, maxTokens)))
	must.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must.NoError(t, err)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	must.NoError(t, err)
	must.StrHasPrefix(t, "data: ", line)
	busy := false
	for _, s := range slots(t, addrs[0]) {
		busy = busy || s.IsProcessing
	}
	must.True(t, busy, must.Sprint("no slot processing while the stream runs"))

	cancel()
	resp.Body.Close()
	testutil.EventuallyEvery(t, 20*time.Second, 20*time.Millisecond, "llama-server's slots to stop processing after the client went away", func() bool {
		for _, s := range slots(t, addrs[0]) {
			if s.IsProcessing {
				return false
			}
		}
		return true
	})
	after := scrape(t, addrs[0])
	generated := after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"]
	t.Logf("the engine generated %.0f of %d tokens before the cancelled stream freed its slot", generated, maxTokens)
	must.Less(t, float64(maxTokens), generated)
	must.Eq(t, 0.0, after["llamacpp:requests_processing"])
}

// scrape reads an engine's /metrics: family -> value (series summed).
func scrape(t *testing.T, addr string) map[string]float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || line[0] == '#' {
			continue
		}
		var name string
		var v float64
		if _, err := fmt.Sscanf(line, "%s %g", &name, &v); err == nil {
			if i := strings.IndexByte(name, '{'); i >= 0 {
				name = name[:i]
			}
			out[name] += v
		}
	}
	return out
}

// The router's tokenizer for llama_cpp engines (router/tokens: /apply-template, then
// /tokenize) gives the ids llama-server caches: the same count as the engine's
// prompt_tokens, and a completion sent as those ids finds every one of them but the last
// (which llama-server always evaluates again) in the slot the request left behind.
func TestRouterTokensMatchLlamaServer(t *testing.T) {
	port := testutil.FreePort(t)
	addr := hostPort("127.0.0.1", port)
	e := startDirect(t, []string{"llama-server", "-m", modelPath, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-t", "1", "-tb", "1", "-np", "1", "-c", "4096"}, addr)
	waitHealthy(t, e, 60*time.Second)
	eng := tokens.NewEngine(tokens.EngineConfig{Timeout: 30 * time.Second, Replicas: func(string) []tokens.Replica {
		return []tokens.Replica{{Address: addr, Engine: "llama_cpp"}}
	}})
	system := sharedSystem("tokenizer")
	cases := []struct{ name, path, body string }{
		{"chat", "/v1/chat/completions", fmt.Sprintf(`{"model":"tiny","max_tokens":1,"messages":[{"role":"system","content":%s},{"role":"user","content":"Which rule comes first?"}]}`,
			strconv.Quote(system))},
		{"completion", "/v1/completions", fmt.Sprintf(`{"model":"tiny","max_tokens":1,"prompt":%s}`, strconv.Quote(system))},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var direct chatAnswer
			code, b := post(t, "http://"+addr+tc.path, tc.body, &direct)
			must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
			req, err := openai.ParseRequest(tc.path, []byte(tc.body))
			must.NoError(t, err)
			ids, err := eng.Tokenize(context.Background(), "tiny", req.Prompt)
			must.NoError(t, err)
			must.Eq(t, direct.Usage.PromptTokens, len(ids), must.Sprint("the router's token count is the engine's"))

			idsJSON, err := json.Marshal(ids)
			must.NoError(t, err)
			var again chatAnswer
			code, b = post(t, "http://"+addr+"/completion", `{"prompt":`+string(idsJSON)+`,"n_predict":1,"cache_prompt":true}`, &again)
			must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
			must.Eq(t, len(ids)-1, again.Timings.CacheN, must.Sprint("the slot holds the router's ids"))
		})
	}
}
