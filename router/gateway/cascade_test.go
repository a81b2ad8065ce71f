package gateway

import (
	"bufio"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// cascadeHarness serves alias "a" as a cascade from oasis-sim "s" to
// oasis-sim "l" with threshold -0.5 and max_small_tokens 16.
func cascadeHarness(t *testing.T) *harness {
	t.Helper()
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-sim")
	sim := func(model string) *testutil.Sim {
		return testutil.StartSim(t, testutil.SimConfig{Bin: bin, Model: model,
			Args: []string{"--host", "127.0.0.1", "--speed", "0", "--log-level", "warn"}})
	}
	s, l := sim("s"), sim("l")
	doc := parseDoc(t, `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l","gate":"logprob","threshold":-0.5,"max_small_tokens":16}}}`)
	return newHarness(t, doc, nil, map[string]string{"s1": "s@" + s.Addr, "l1": "l@" + l.Addr})
}

// answer is what a test reads of a cascade's answer, streamed or not.
type answer struct {
	status                int
	cascade, smallLogprob string
	smallCompletion       string
	model, text           string
	logprobs              bool // any choice carried log probabilities
	usage                 bool
	done                  bool
}

func readAnswer(t *testing.T, resp *http.Response, stream bool) answer {
	t.Helper()
	defer resp.Body.Close()
	a := answer{status: resp.StatusCode, cascade: resp.Header.Get(CascadeHeader),
		smallLogprob: resp.Header.Get(SmallLogprobHeader), smallCompletion: resp.Header.Get(SmallCompletionTokensHeader)}
	type choice struct {
		Text     string `json:"text"`
		Message  struct{ Content string }
		Delta    struct{ Content string }
		Logprobs json.RawMessage `json:"logprobs"`
	}
	type doc struct {
		Model   string          `json:"model"`
		Choices []choice        `json:"choices"`
		Usage   json.RawMessage `json:"usage"`
	}
	take := func(d doc) {
		if d.Model != "" {
			a.model = d.Model
		}
		a.usage = a.usage || len(d.Usage) > 0 && string(d.Usage) != "null"
		for _, c := range d.Choices {
			a.text += c.Text + c.Message.Content + c.Delta.Content
			a.logprobs = a.logprobs || len(c.Logprobs) > 0 && string(c.Logprobs) != "null"
		}
	}
	if !stream {
		var d doc
		must.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
		take(d)
		return a
	}
	must.StrHasPrefix(t, "text/event-stream", resp.Header.Get("Content-Type"))
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if data == "[DONE]" {
			a.done = true
			continue
		}
		var d doc
		must.NoError(t, json.Unmarshal([]byte(data), &d))
		take(d)
	}
	return a
}

// A request for a cascade alias is answered by the small oasis-sim when its
// mean token logprob clears the threshold, else by the large one; streamed
// or not, chat or completions, with log probabilities only when asked for.
func TestCascadeWithSim(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-sim")
	}
	h := cascadeHarness(t)
	const confident, unsure = "[oasis:logprob=-0.1]", "[oasis:logprob=-2]"
	chat := func(marker, extra string) string {
		return `{"model":"a","messages":[{"role":"user","content":"q ` + marker + `"}],"max_tokens":8,"seed":1` + extra + `}`
	}
	comp := func(marker, extra string) string {
		return `{"model":"a","prompt":"q ` + marker + `","max_tokens":8,"seed":1` + extra + `}`
	}
	cases := []struct {
		name, path, body string
		stream           bool
		want             string // cascade header
		wantLogprobs     bool
		wantUsage        bool
	}{
		{"chat confident", "/v1/chat/completions", chat(confident, ""), false, "small", false, true},
		{"chat unsure", "/v1/chat/completions", chat(unsure, ""), false, "escalated", false, true},
		{"chat confident, logprobs asked", "/v1/chat/completions", chat(confident, `,"logprobs":true`), false, "small", true, true},
		{"chat stream confident", "/v1/chat/completions", chat(confident, `,"stream":true,"stream_options":{"include_usage":true}`), true, "small", false, true},
		{"chat stream unsure", "/v1/chat/completions", chat(unsure, `,"stream":true`), true, "escalated", false, false},
		{"completions confident", "/v1/completions", comp(confident, ""), false, "small", false, true},
		{"completions unsure, logprobs asked", "/v1/completions", comp(unsure, `,"logprobs":2`), false, "escalated", true, true},
		{"completions stream confident", "/v1/completions", comp(confident, `,"stream":true`), true, "small", false, false},
		{"cut by max_small_tokens", "/v1/chat/completions", strings.Replace(chat(confident, ""), `"max_tokens":8`, `"max_tokens":64`, 1), false, "escalated", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := readAnswer(t, h.post(tc.path, tc.body), tc.stream)
			must.Eq(t, 200, a.status)
			must.Eq(t, tc.want, a.cascade)
			wantModel := map[string]string{"small": "s", "escalated": "l"}[tc.want]
			must.Eq(t, wantModel, a.model)
			must.NotEq(t, "", a.text)
			must.Eq(t, tc.wantLogprobs, a.logprobs)
			must.Eq(t, tc.wantUsage, a.usage)
			must.Eq(t, tc.stream, a.done)
			must.NotEq(t, "", a.smallLogprob) // the small leg's figures in either case
			must.NotEq(t, "", a.smallCompletion)
		})
	}
	must.Eq(t, 5.0, promtest.ToFloat64(h.m.CascadeRequests.WithLabelValues("a", "small")))
	must.Eq(t, 4.0, promtest.ToFloat64(h.m.CascadeRequests.WithLabelValues("a", "escalated")))
	must.Positive(t, promtest.ToFloat64(h.m.CascadeSmallTokens.WithLabelValues("a", "escalated", "completion")))
	must.Eq(t, 2, promtest.CollectAndCount(h.m.CascadeLeg)) // small and large legs' series
}
