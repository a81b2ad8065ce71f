package llamacpp

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/enginestats"
)

// The simulator checked against the real engine: the same requests go to oasis-sim (vLLM's
// API, the one the router speaks to every engine) and to llama-server, and what the router
// depends on must agree — the members it reads, with their types and meaning, the SSE
// framing, error shapes and statuses, usage arithmetic, the model list and the metrics
// format. What differs on purpose is listed in sim/README.md ("Against llama-server") and
// nowhere asserted equal here.
func TestSimMatchesLlamaServer(t *testing.T) {
	port := testutil.FreePort(t)
	llama := hostPort("127.0.0.1", port)
	e := startDirect(t, []string{"llama-server", "-m", modelPath, "--host", "127.0.0.1", "--port", strconv.Itoa(port),
		"-t", "1", "-tb", "1", "-np", "1", "-c", "2048", "--alias", "tiny", "--metrics"}, llama)
	sim := testutil.StartSim(t, testutil.SimConfig{Bin: stack.Bin("oasis-sim"), Model: "tiny", Args: []string{"--max-model-len", "2048"}})
	waitHealthy(t, e, 60*time.Second)
	engines := map[string]string{"oasis-sim": sim.Addr, "llama-server": llama}

	chat := `{"model":"tiny","max_tokens":3,"messages":[{"role":"user","content":"Say something."}]}`
	completion := `{"model":"tiny","max_tokens":3,"prompt":"Say something."}`
	stream := func(body string) string {
		return strings.Replace(body, `{"model"`, `{"stream":true,"stream_options":{"include_usage":true},"model"`, 1)
	}
	t.Run("chat", func(t *testing.T) {
		forEach(t, engines, func(t *testing.T, addr string) { checkAnswer(t, addr, "/v1/chat/completions", chat, "chat.completion") })
	})
	t.Run("completion", func(t *testing.T) {
		forEach(t, engines, func(t *testing.T, addr string) {
			checkAnswer(t, addr, "/v1/completions", completion, "text_completion")
		})
	})
	t.Run("chat stream", func(t *testing.T) {
		forEach(t, engines, func(t *testing.T, addr string) {
			checkStream(t, addr, "/v1/chat/completions", stream(chat), "chat.completion.chunk")
		})
	})
	t.Run("completion stream", func(t *testing.T) {
		forEach(t, engines, func(t *testing.T, addr string) {
			checkStream(t, addr, "/v1/completions", stream(completion), "text_completion")
		})
	})
	over := fmt.Sprintf(`{"model":"tiny","max_tokens":2,"prompt":%q}`, strings.Repeat("word ", 3000))
	for _, tc := range []struct{ name, path, body string }{
		{"messages not an array", "/v1/chat/completions", `{"model":"tiny","messages":"hello"}`},
		{"prompt over the context", "/v1/completions", over},
	} {
		t.Run("error: "+tc.name, func(t *testing.T) {
			forEach(t, engines, func(t *testing.T, addr string) { checkError(t, addr, tc.path, tc.body) })
		})
	}
	t.Run("models", func(t *testing.T) {
		forEach(t, engines, func(t *testing.T, addr string) {
			var out struct {
				Object string `json:"object"`
				Data   []struct {
					ID     string `json:"id"`
					Object string `json:"object"`
				} `json:"data"`
			}
			code, b := getJSON(t, "http://"+addr+"/v1/models", &out)
			must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
			must.Eq(t, "list", out.Object)
			must.Len(t, 1, out.Data)
			must.Eq(t, "tiny", out.Data[0].ID)
			must.Eq(t, "model", out.Data[0].Object)
		})
	})
	t.Run("metrics", func(t *testing.T) {
		forEach(t, engines, func(t *testing.T, addr string) {
			resp, err := http.Get("http://" + addr + "/metrics")
			must.NoError(t, err)
			defer resp.Body.Close()
			must.Eq(t, http.StatusOK, resp.StatusCode)
			// What the router's scraper reads of it: load (running, waiting) and generated
			// tokens, under each engine's own names (router/enginestats).
			m, err := enginestats.ParseEngineMetrics(resp.Body, nil)
			must.NoError(t, err)
			must.True(t, m.HasLoad, must.Sprint("running/waiting requests"))
			must.True(t, m.HasGenTokens, must.Sprint("generated tokens"))
			must.Positive(t, m.GenTokens, must.Sprint("the answers above generated tokens"))
		})
	})
}

func forEach(t *testing.T, engines map[string]string, f func(t *testing.T, addr string)) {
	for _, name := range []string{"oasis-sim", "llama-server"} {
		t.Run(name, func(t *testing.T) { f(t, engines[name]) })
	}
}

// answer is what the router reads of a non-streamed answer.
type answer struct {
	ID      *string `json:"id"`
	Object  string  `json:"object"`
	Created *int64  `json:"created"`
	Model   string  `json:"model"`
	Choices []struct {
		Index   *int `json:"index"`
		Message *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"message"`
		Delta        json.RawMessage `json:"delta"`
		Text         *string         `json:"text"`
		FinishReason *string         `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails *struct {
			CachedTokens *int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func checkAnswer(t *testing.T, addr, path, body, object string) {
	var a answer
	code, b := post(t, "http://"+addr+path, body, &a)
	must.Eq(t, http.StatusOK, code, must.Sprintf("%s", b))
	must.NotNil(t, a.ID)
	must.NotEq(t, "", *a.ID)
	must.Eq(t, object, a.Object)
	must.NotNil(t, a.Created)
	must.Eq(t, "tiny", a.Model)
	must.Len(t, 1, a.Choices, must.Sprintf("%s", b))
	c := a.Choices[0]
	must.NotNil(t, c.Index)
	if object == "chat.completion" {
		must.NotNil(t, c.Message)
		must.Eq(t, "assistant", c.Message.Role)
		must.NotNil(t, c.Message.Content)
	} else {
		must.NotNil(t, c.Text)
	}
	must.NotNil(t, c.FinishReason)
	must.Eq(t, "length", *c.FinishReason, must.Sprint("max_tokens 3 reached"))
	checkUsage(t, a, 3, b)
}

func checkUsage(t *testing.T, a answer, completion int, b []byte) {
	t.Helper()
	must.NotNil(t, a.Usage, must.Sprintf("%s", b))
	must.Positive(t, a.Usage.PromptTokens)
	must.Eq(t, completion, a.Usage.CompletionTokens)
	must.Eq(t, a.Usage.PromptTokens+a.Usage.CompletionTokens, a.Usage.TotalTokens)
	must.NotNil(t, a.Usage.PromptTokensDetails, must.Sprint("prompt_tokens_details: the router's cached-token accounting"))
	must.NotNil(t, a.Usage.PromptTokensDetails.CachedTokens)
}

// checkStream reads an SSE answer as the router relays it: "data: " events separated by
// blank lines, one id for the whole answer, the usage in a last chunk with no choices,
// then "data: [DONE]".
func checkStream(t *testing.T, addr, path, body, object string) {
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.StrHasPrefix(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	var events []string
	blank := true // an event starts after a blank line
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			blank = true
			continue
		}
		must.True(t, blank, must.Sprintf("two lines in one event: %q", line))
		must.StrHasPrefix(t, "data: ", line)
		events = append(events, strings.TrimPrefix(line, "data: "))
		blank = false
	}
	must.NoError(t, sc.Err())
	must.Greater(t, 2, len(events))
	must.Eq(t, "[DONE]", events[len(events)-1])
	var ids []string
	finished := 0
	var last answer
	for _, ev := range events[:len(events)-1] {
		var a answer
		must.NoError(t, json.Unmarshal([]byte(ev), &a), must.Sprint(ev))
		must.Eq(t, object, a.Object)
		must.NotNil(t, a.ID)
		ids = append(ids, *a.ID)
		for _, c := range a.Choices {
			if c.FinishReason != nil {
				must.Eq(t, "length", *c.FinishReason)
				finished++
			}
		}
		last = a
	}
	for _, id := range ids {
		must.Eq(t, ids[0], id, must.Sprint("one id for every chunk"))
	}
	must.Eq(t, 1, finished, must.Sprint("one chunk carries finish_reason"))
	// The usage is in the last chunk: one of its own with no choices (vLLM, OpenAI), or the
	// finishing chunk (llama-server's completions); the router counts either and strips only
	// the former toward a client that did not ask for it (router/gateway/streamusage.go).
	checkUsage(t, last, 3, []byte(events[len(events)-2]))
}

// checkError: a refused request is a 4xx with OpenAI's error object (message and type
// strings); the router rewrites it into one dialect keeping the status (router/README "API").
func checkError(t *testing.T, addr, path, body string) {
	resp, err := http.Post("http://"+addr+path, "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	must.Eq(t, http.StatusBadRequest, resp.StatusCode, must.Sprintf("%s", b))
	var e struct {
		Error *struct {
			Message string          `json:"message"`
			Type    string          `json:"type"`
			Code    json.RawMessage `json:"code"`
		} `json:"error"`
	}
	must.NoError(t, json.Unmarshal(b, &e), must.Sprintf("%s", b))
	must.NotNil(t, e.Error, must.Sprintf("%s", b))
	must.NotEq(t, "", e.Error.Message)
	must.NotEq(t, "", e.Error.Type)
}

func getJSON(t *testing.T, url string, out any) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	if resp.StatusCode == http.StatusOK {
		must.NoError(t, json.Unmarshal(b, out), must.Sprintf("%s", b))
	}
	return resp.StatusCode, b
}
