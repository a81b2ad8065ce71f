package server

import (
	"encoding/json"
	"testing"

	"github.com/shoenig/test/must"
)

// The log probabilities a request gets are fixed by the oasis_logprob field or
// a prompt marker, in both endpoints' vLLM shapes.
func TestControlledConfidence(t *testing.T) {
	_, url := startServer(t, nil)
	cases := []struct {
		name, path string
		body       map[string]any
		want       float64
	}{
		{"chat marker", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user",
			"content": "hard question [oasis:logprob=-2.25]"}}, "max_tokens": 6, "logprobs": true}, -2.25},
		{"chat field wins", "/v1/chat/completions", map[string]any{"messages": []any{map[string]any{"role": "user",
			"content": "[oasis:logprob=-2]"}}, "max_tokens": 6, "logprobs": true, "oasis_logprob": -0.1}, -0.1},
		{"completions marker", "/v1/completions", map[string]any{"prompt": "[oasis:logprob=-0.05] easy", "max_tokens": 6, "logprobs": 1}, -0.05},
		{"positive clamps to 0", "/v1/completions", map[string]any{"prompt": "x", "max_tokens": 3, "logprobs": 0, "oasis_logprob": 3}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, body := post(t, url+tc.path, tc.body)
			must.Eq(t, 200, status, must.Sprint(string(body)))
			var resp struct {
				Choices []struct {
					Logprobs struct {
						Content []struct {
							Logprob float64 `json:"logprob"`
						} `json:"content"`
						TokenLogprobs []float64 `json:"token_logprobs"`
					} `json:"logprobs"`
				} `json:"choices"`
			}
			must.NoError(t, json.Unmarshal(body, &resp))
			got := resp.Choices[0].Logprobs.TokenLogprobs
			for _, c := range resp.Choices[0].Logprobs.Content {
				got = append(got, c.Logprob)
			}
			must.SliceNotEmpty(t, got)
			for _, lp := range got {
				must.Eq(t, tc.want, lp)
			}
		})
	}
}
