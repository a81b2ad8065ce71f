package openai

import "testing"

func TestIsPreamble(t *testing.T) {
	cases := []struct {
		data string
		want bool
	}{
		{` {"choices":[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]}`, true},
		{`{"choices":[{"index":0,"delta":{"role":"assistant"},"logprobs":null}],"usage":{"prompt_tokens":3}}`, true},
		{`{"choices":[{"delta":{"content":null,"reasoning_content":"","tool_calls":[]}}]}`, true},
		{`{"choices":[{"text":""}]}`, true},
		{`{"choices":[{"delta":{"role":"assistant","content":""},"logprobs":{"content":[]}}]}`, true},
		{`{"choices":[{"delta":{"content":"hi"}}]}`, false},
		{`{"choices":[{"text":"hi"}]}`, false},
		{`{"choices":[{"delta":{"reasoning_content":"hm"}}]}`, false},
		{`{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}`, false},
		{`{"choices":[{"delta":{},"finish_reason":"stop"}]}`, false},
		{`{"choices":[{"delta":{"refusal":"no"}}]}`, false},
		{`{"choices":[{"delta":{"content":"a \"content\":\"\" b"}}]}`, false},
		{`{"choices":[]}`, false},
		{`{"error":{"message":"bad"}}`, false},
		{`[DONE]`, false},
		{`not json`, false},
	}
	for _, tc := range cases {
		if got := IsPreamble([]byte(tc.data)); got != tc.want {
			t.Errorf("IsPreamble(%s) = %v, want %v", tc.data, got, tc.want)
		}
	}
}
