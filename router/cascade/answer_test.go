package cascade

import (
	"testing"

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
			a := &Answer{capped: tc.capped}
			err := a.Read([]byte(tc.body))
			if tc.wantErr {
				must.Error(t, err)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.wantTokens, a.tokens)
			must.True(t, a.mean-tc.wantMean < 1e-3 && tc.wantMean-a.mean < 1e-3, must.Sprintf("mean %v", a.mean))
			must.Eq(t, tc.accept, a.Accept(c))
		})
	}
}
