package server

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/oasis-llm/oasis/internal/tokenizer"
	"github.com/shoenig/test/must"
)

type idsAnswer struct {
	PromptTokenIDs []int32 `json:"prompt_token_ids"` // chat: top level
	Choices        []struct {
		Text           string  `json:"text"`
		TokenIDs       []int32 `json:"token_ids"`
		PromptTokenIDs []int32 `json:"prompt_token_ids"`
		FinishReason   *string `json:"finish_reason"`
		Message        struct {
			Content string `json:"content"`
		} `json:"message"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
}

// streamIDs reads a stream's prompt ids, token ids and text.
func streamIDs(t *testing.T, body []byte) (prompt, toks []int32, text string) {
	t.Helper()
	for _, ev := range sse(t, body) {
		if ev == "[DONE]" {
			continue
		}
		a := decode[idsAnswer](t, []byte(ev))
		prompt = append(prompt, a.PromptTokenIDs...)
		for _, c := range a.Choices {
			prompt = append(prompt, c.PromptTokenIDs...)
			toks = append(toks, c.TokenIDs...)
			text += c.Text + c.Delta.Content
		}
	}
	return prompt, toks, text
}

// A completion cut after k tokens and continued from prompt + those tokens
// (another server, max_tokens reduced) equals the uninterrupted answer, for
// every cut, with a seed and at temperature 0.
func TestGreedyContinuationCompletions(t *testing.T) {
	_, a := startServer(t, nil)
	_, b := startServer(t, func(c *Config) { c.Seed = 99 }) // another server, another --seed
	for _, sampling := range []map[string]any{{"seed": 7}, {"temperature": 0}} {
		req := map[string]any{"prompt": "tell me a story", "max_tokens": 40, "stream": true, "return_token_ids": true}
		for k, v := range sampling {
			req[k] = v
		}
		st, body := post(t, a+"/v1/completions", req)
		must.EqOp(t, 200, st)
		prompt, whole, text := streamIDs(t, body)
		must.Len(t, 40, whole)
		must.Eq(t, tokenizer.EncodePrompt("tell me a story"), prompt)
		must.EqOp(t, tokenizer.Decode(whole, true), text)
		for _, k := range []int{1, 2, 3, 17, 39} {
			cont := map[string]any{"prompt": append(append([]int32(nil), prompt...), whole[:k]...),
				"max_tokens": 40 - k, "stream": true, "return_token_ids": true}
			for s, v := range sampling {
				cont[s] = v
			}
			st, body := post(t, b+"/v1/completions", cont)
			must.EqOp(t, 200, st, must.Sprintf("%s", body))
			_, rest, restText := streamIDs(t, body)
			must.Eq(t, whole[k:], rest, must.Sprintf("cut after %d tokens, %v", k, sampling))
			must.EqOp(t, text, tokenizer.Decode(whole[:k], true)+restText)
		}
	}
}

// Without max_tokens a greedy answer ends with its end of turn at the same
// token however it is cut.
func TestGreedyContinuationNaturalEnd(t *testing.T) {
	_, url := startServer(t, nil)
	msgs := []map[string]any{{"role": "user", "content": "hello there"}}
	st, body := post(t, url+"/v1/chat/completions", map[string]any{"messages": msgs, "seed": 3, "return_token_ids": true})
	must.EqOp(t, 200, st)
	whole := decode[idsAnswer](t, body)
	toks := whole.Choices[0].TokenIDs
	must.EqOp(t, "stop", *whole.Choices[0].FinishReason)
	must.EqOp(t, tokenizer.EOT, toks[len(toks)-1])
	must.Eq(t, tokenizer.EncodeChat([]tokenizer.Message{{Role: "user", Content: "hello there"}}, true), whole.PromptTokenIDs)
	text := whole.Choices[0].Message.Content

	// Chat continues through its final assistant message: the text so far.
	for _, k := range []int{1, 2, len(toks) / 2, len(toks) - 1} {
		sofar := tokenizer.Decode(toks[:k], true)
		cont := map[string]any{"messages": append(append([]map[string]any(nil), msgs...),
			map[string]any{"role": "assistant", "content": sofar}),
			"continue_final_message": true, "add_generation_prompt": false, "seed": 3, "stream": true, "return_token_ids": true}
		st, body := post(t, url+"/v1/chat/completions", cont)
		must.EqOp(t, 200, st, must.Sprintf("%s", body))
		prompt, rest, restText := streamIDs(t, body)
		must.Eq(t, append(append([]int32(nil), whole.PromptTokenIDs...), toks[:k]...), prompt, must.Sprintf("cut after %d", k))
		must.Eq(t, toks[k:], rest, must.Sprintf("cut after %d", k))
		must.EqOp(t, text, sofar+restText)
	}
}

func TestContinueFinalMessageErrors(t *testing.T) {
	_, url := startServer(t, nil)
	st, body := post(t, url+"/v1/chat/completions", map[string]any{"messages": []map[string]any{{"role": "assistant", "content": "x"}},
		"continue_final_message": true})
	must.EqOp(t, 400, st)
	must.StrContains(t, string(body), "add_generation_prompt")
}

// Unseeded sampling stays random: two answers to the same prompt differ.
func TestSampledNotGreedy(t *testing.T) {
	_, url := startServer(t, nil)
	var texts []string
	for range 2 {
		_, body := post(t, url+"/v1/completions", map[string]any{"prompt": "p", "max_tokens": 30})
		var a idsAnswer
		must.NoError(t, json.Unmarshal(body, &a))
		texts = append(texts, a.Choices[0].Text)
	}
	must.False(t, strings.EqualFold(texts[0], texts[1]))
}
