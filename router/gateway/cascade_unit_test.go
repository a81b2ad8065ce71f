package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/policy"
)

// The gate reads vLLM's and SGLang's log probability shapes alike.
func TestSmallAnswerGate(t *testing.T) {
	threshold := -0.5
	c := &policy.Cascade{Small: "s", Large: "l", Threshold: &threshold}
	cases := []struct {
		name, body string
		capped     bool
		wantErr    bool
		wantTokens int
		wantMean   float64
		accept     bool
	}{
		{"chat content", `{"choices":[{"finish_reason":"stop","logprobs":{"content":[{"token":"a","logprob":-0.2},{"token":"b","logprob":-0.4}]}}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`,
			false, false, 2, -0.3, true},
		{"completions with a null entry", `{"choices":[{"finish_reason":"stop","logprobs":{"tokens":["x","a","b"],"token_logprobs":[null,-1,-2]}}]}`,
			false, false, 2, -1.5, false},
		{"mean, not minimum", `{"choices":[{"finish_reason":"stop","logprobs":{"content":[{"logprob":-0.01},{"logprob":-0.01},{"logprob":-1.2}]}}]}`,
			false, false, 3, -0.4067, true},
		{"no logprobs fails the gate", `{"choices":[{"finish_reason":"stop","logprobs":null}]}`, false, false, 0, 0, false},
		{"cut by the cap", `{"choices":[{"finish_reason":"length","logprobs":{"content":[{"logprob":-0.1}]}}]}`, true, false, 1, -0.1, false},
		{"client's own length", `{"choices":[{"finish_reason":"length","logprobs":{"content":[{"logprob":-0.1}]}}]}`, false, false, 1, -0.1, true},
		{"no choices", `{"choices":[]}`, false, true, 0, 0, false},
		{"not JSON", `oops`, false, true, 0, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := &smallAnswer{body: []byte(tc.body), capped: tc.capped}
			err := a.parse()
			if tc.wantErr {
				must.Error(t, err)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.wantTokens, a.tokens)
			must.True(t, a.mean-tc.wantMean < 1e-3 && tc.wantMean-a.mean < 1e-3, must.Sprintf("mean %v", a.mean))
			must.Eq(t, tc.accept, a.accept(c))
		})
	}
}

// A small leg that fails escalates; the client never sees its error.
func TestCascadeSmallFails(t *testing.T) {
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer bad.Close()
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"model":"l","choices":[{"index":0,"message":{"role":"assistant","content":"large"},"finish_reason":"stop"}]}`)
	}))
	defer good.Close()
	doc := parseDoc(t, `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l","threshold":-1}}}`)
	h := newHarness(t, doc, nil, map[string]string{"s1": "s@" + addr(bad), "l1": "l@" + addr(good)})
	resp := h.post("/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"x"}]}`)
	body := readAllString(t, resp)
	must.Eq(t, 200, resp.StatusCode)
	must.Eq(t, "escalated", resp.Header.Get(CascadeHeader))
	must.StrContains(t, body, `"large"`)
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.CascadeRequests.WithLabelValues("a", "small_failed")))
}
