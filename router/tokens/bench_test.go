package tokens

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// prepareBenchBody is a chat request of a few KB: a long system prompt and
// a conversation under way.
func prepareBenchBody(b *testing.B) []byte {
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	body, err := json.Marshal(struct {
		Model         string         `json:"model"`
		Messages      []msg          `json:"messages"`
		MaxTokens     int            `json:"max_tokens"`
		Stream        bool           `json:"stream"`
		StreamOptions map[string]any `json:"stream_options"`
		Temperature   float64        `json:"temperature"`
	}{
		Model: "meta-llama/Llama-3.1-8B-Instruct",
		Messages: []msg{
			{"system", strings.Repeat("You are a careful assistant for a logistics company. Answer in short, precise sentences, quote the order number, and never invent tracking data. ", 12)},
			{"user", "Where is order 48213? It was due on Tuesday and the tracking page has not changed since the warehouse scan."},
			{"assistant", strings.Repeat("Order 48213 left the Leeds warehouse on Monday at 17:40 and is with the regional carrier. ", 6)},
			{"user", "Can you ask the carrier for a delivery window and tell me whether I need to be home to sign for it?"},
		},
		MaxTokens: 256, Stream: true, StreamOptions: map[string]any{"include_usage": true}, Temperature: 0.2,
	})
	if err != nil {
		b.Fatal(err)
	}
	return body
}

// BenchmarkPrepareRequest is the weighted policy's per-request body work:
// parsing the routing fields and the sim tokenization the prefix and ttft
// terms trigger.
func BenchmarkPrepareRequest(b *testing.B) {
	body := prepareBenchBody(b)
	auto := NewAuto(func(string) []Replica { return []Replica{{Engine: "sim"}} }, nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		f, err := openai.ParseRequest("/v1/chat/completions", body)
		if err != nil {
			b.Fatal(err)
		}
		req := scoring.Request{Model: f.Model, Path: "/v1/chat/completions", Body: body, Stream: f.Stream, Prompt: f.Prompt}
		auto.Prepare(&req)
		if toks, err := req.PromptTokens(ctx); err != nil || len(toks) == 0 {
			b.Fatal(err)
		}
	}
}
