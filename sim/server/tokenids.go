package server

import (
	"encoding/json"
	"strconv"
	"strings"

	"github.com/oasis-llm/oasis/internal/tokenizer"
)

// Token ids in and out, as vLLM serves them: a completion prompt may be
// token ids (promptTokens); return_token_ids adds prompt_token_ids (in a
// completion's choice, at a chat answer's top level; in a stream's first
// chunk only) and each choice's token_ids (in a stream, the chunk's own);
// continue_final_message renders a chat's last message open, for the model
// to go on with it.

// chatPrompt tokenizes a chat request's messages with its template.
func chatPrompt(msgs []tokenizer.Message, req *apiRequest) ([]int32, error) {
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if !req.ContinueFinalMessage {
		return tokenizer.EncodeChat(msgs, addGen), nil
	}
	if addGen {
		return nil, badRequest("continue_final_message", "Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	s := strings.TrimSuffix(tokenizer.RenderChat(msgs, false), tokenizer.TokenString(tokenizer.EOT))
	return tokenizer.Encode(make([]int32, 0, len(s)/3+8), s), nil
}

// greedySeed is the seed of a request whose tokens follow from its context
// (greedy.go): its seed, 0 at temperature 0; nil when it samples.
func greedySeed(seed *int64, temp *float64) *uint64 {
	var s uint64
	switch {
	case seed != nil:
		s = uint64(*seed)
	case temp != nil && *temp == 0:
	default:
		return nil
	}
	return &s
}

// appendIDs appends `,"name":[ids]` to b.
func appendIDs(b []byte, name string, ids []int32) []byte {
	b = append(b, ',', '"')
	b = append(b, name...)
	b = append(b, `":[`...)
	for i, t := range ids {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, int64(t), 10)
	}
	return append(b, ']')
}

// withIDs returns the JSON object obj with the member name: ids added last.
func withIDs(obj []byte, name string, ids []int32) []byte {
	out := append([]byte(nil), obj[:len(obj)-1]...)
	return append(appendIDs(out, name, ids), '}')
}

// addTokenIDs adds return_token_ids' members to a whole answer.
func addTokenIDs(resp map[string]any, p *prepared) {
	choice := resp["choices"].([]any)[0].(map[string]any)
	choice["token_ids"] = p.gen.tokens
	if p.chat {
		resp["prompt_token_ids"] = p.prompt
	} else {
		choice["prompt_token_ids"] = p.prompt
	}
}

// chunkIDs adds return_token_ids' members to the streamed choice of token
// i (JSON in raw, or a map).
func chunkIDs(choice any, p *prepared, i int) any {
	tok := p.gen.tokens[i : i+1]
	switch c := choice.(type) {
	case json.RawMessage:
		if i == 0 && !p.chat {
			c = withIDs(c, "prompt_token_ids", p.prompt)
		}
		return json.RawMessage(withIDs(c, "token_ids", tok))
	case map[string]any:
		if i == 0 && !p.chat {
			c["prompt_token_ids"] = p.prompt
		}
		c["token_ids"] = tok
	}
	return choice
}

// promptIDsHead is a stream chunk's head (up to its choices) with the
// prompt's ids added.
func promptIDsHead(head string, prompt []int32) string {
	const choices = `,"choices":[`
	b := appendIDs([]byte(strings.TrimSuffix(head, choices)), "prompt_token_ids", prompt)
	return string(b) + choices
}
