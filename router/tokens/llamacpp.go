package tokens

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/oasis-llm/oasis/router/openai"
)

// llamaCpp is llama-server's engine name in service meta (oasis_engine).
const llamaCpp = "llama_cpp"

// templateSlack bounds what a chat template adds to the messages it
// renders (role headers, a default system prompt, the date): an
// /apply-template answer longer than the messages plus this is refused.
const templateSlack = 64 << 10

// askLlamaCpp tokenizes p as llama-server does when it serves it. A
// completion's prompt goes to /tokenize as its content (a string, or token
// ids and strings, as llama-server takes them); a chat's messages go first
// to /apply-template, whose rendered prompt then goes to /tokenize. Special
// tokens are added (BOS where the model's vocabulary asks for it) and
// special-token text in the rendered template is parsed, as llama-server's
// completion endpoints do: the ids, and so the router's block digests, are
// the ones the engine's slot caches (TestRouterTokensMatchLlamaServer).
func (e *Engine) askLlamaCpp(ctx context.Context, r Replica, p openai.Prompt, payload []byte) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	base := "http://" + r.Address
	content := p.Prompt
	if p.Chat {
		rendered, err := e.applyTemplate(ctx, base+"/apply-template", p)
		if err != nil {
			return nil, err
		}
		content = rendered
	}
	// Raw values appended as they came (the body parsed as JSON; the
	// rendered prompt is checked to be a string), not encoded again.
	const tail = `,"add_special":true,"parse_special":true}`
	body := make([]byte, 0, len(`{"content":`)+len(content)+len(tail))
	body = append(append(append(body, `{"content":`...), content...), tail...)
	return e.tokenize(ctx, base+"/tokenize", body, payload)
}

// applyTemplate renders p's messages with the engine's chat template and
// returns the prompt as a JSON string.
func (e *Engine) applyTemplate(ctx context.Context, url string, p openai.Prompt) (json.RawMessage, error) {
	body := make([]byte, 0, len(`{"messages":}`)+len(p.Messages)+len(`,"add_generation_prompt":false`))
	body = append(append(body, `{"messages":`...), p.Messages...)
	body = append(appendFlag(body, "add_generation_prompt", p.AddGenerationPrompt), '}')
	// The prompt is JSON-escaped: up to 6 bytes per byte of the messages.
	limit := int64(6*(len(p.Messages)+templateSlack)) + answerSlack
	answer, err := e.post(ctx, url, body, limit)
	if err != nil {
		return nil, err
	}
	var out struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	if err := json.Unmarshal(answer, &out); err != nil {
		return nil, fmt.Errorf("decoding %s response: %w", url, err)
	}
	var s string
	if err := json.Unmarshal(out.Prompt, &s); err != nil {
		return nil, fmt.Errorf("%s: \"prompt\" is not a string", url)
	}
	return out.Prompt, nil
}
