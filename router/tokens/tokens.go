// Package tokens turns an OpenAI request's prompt, as openai.ParseRequest
// found it in the body, into the token ids the engine will see, so the
// router can digest the prompt's KV blocks.
//
// Three tokenizers implement one interface:
//   - Sim: oasis-sim's stand-in tokenizer and chat template (internal/tokenizer),
//     exact for `sim` engines, no round trip;
//   - Engine: the engine's own POST /tokenize (vLLM, SGLang, TensorRT-LLM), on
//     any healthy replica of the model, the chat template applied by the engine;
//     results are cached so a repeated prompt is not tokenized again, and
//     concurrent identical prompts share one round trip;
//   - Bytes: an approximate mode when neither is available: the prompt's bytes
//     packed four to a pseudo-token. Its "blocks" do not line up with the
//     engine's real blocks, so it only serves approximate (decision-learned)
//     cache state, never event-driven state.
//
// Auto picks one per model from the engines serving it; a local tokenizer can
// replace the round trip later by implementing Tokenizer.
package tokens

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/oasis-llm/oasis/internal/tokenizer"
	"github.com/oasis-llm/oasis/router/openai"
)

// Tokenizer returns the prompt token ids of a request's prompt (as
// openai.ParseRequest found it in the body) for model.
type Tokenizer interface {
	Tokenize(ctx context.Context, model string, p openai.Prompt) ([]uint32, error)
}

// ErrNoPrompt means the request has no prompt this package can tokenize.
var ErrNoPrompt = errors.New("request has no prompt to tokenize")

// checkPrompt refuses a prompt no engine would tokenize: no messages on a
// chat request, no prompt on any other, or a flag that is not a boolean.
func checkPrompt(p openai.Prompt) error {
	switch {
	case p.Chat && p.Messages == nil:
		return fmt.Errorf("messages: %w", ErrNoPrompt)
	case !p.Chat && p.Prompt == nil:
		return fmt.Errorf("prompt: %w", ErrNoPrompt)
	case p.AddGenerationPrompt == openai.FlagInvalid:
		return errors.New("add_generation_prompt must be a boolean")
	case p.AddSpecialTokens == openai.FlagInvalid:
		return errors.New("add_special_tokens must be a boolean")
	}
	return nil
}

// Sim is oasis-sim's tokenizer and chat template: exactly the ids an oasis-sim
// engine computes for the same body.
type Sim struct{}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// Tokenize implements Tokenizer.
func (Sim) Tokenize(_ context.Context, _ string, p openai.Prompt) ([]uint32, error) {
	if err := checkPrompt(p); err != nil {
		return nil, err
	}
	var ids []int32
	if p.Chat {
		msgs, err := simMessages(p.Messages)
		if err != nil {
			return nil, err
		}
		ids = tokenizer.EncodeChat(msgs, p.AddGenerationPrompt.Or(true))
	} else {
		var err error
		ids, err = simPrompt(p.Prompt, p.AddSpecialTokens.Or(true))
		if err != nil {
			return nil, err
		}
	}
	out := make([]uint32, len(ids))
	for i, t := range ids {
		out[i] = uint32(t)
	}
	return out, nil
}

func messageText(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", errors.New("message content must be a string or an array of content parts")
	}
	texts := make([]string, 0, len(parts))
	for _, p := range parts {
		if p.Type == "text" {
			texts = append(texts, p.Text)
		}
	}
	return strings.Join(texts, "\n"), nil
}

func simMessages(raw json.RawMessage) ([]tokenizer.Message, error) {
	var msgs []chatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	if len(msgs) == 0 {
		return nil, fmt.Errorf("messages: %w", ErrNoPrompt)
	}
	out := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		t, err := messageText(m.Content)
		if err != nil {
			return nil, fmt.Errorf("messages[%d]: %w", i, err)
		}
		out[i] = tokenizer.Message{Role: m.Role, Content: t}
	}
	return out, nil
}

func simPrompt(raw json.RawMessage, addSpecial bool) ([]int32, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if addSpecial {
			return tokenizer.EncodePrompt(s), nil
		}
		return tokenizer.Encode(nil, s), nil
	}
	var ids []int32
	if err := json.Unmarshal(raw, &ids); err == nil {
		return ids, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil && len(strs) == 1 {
		return simPrompt(mustJSON(strs[0]), addSpecial)
	}
	var idss [][]int32
	if err := json.Unmarshal(raw, &idss); err == nil && len(idss) == 1 {
		return idss[0], nil
	}
	return nil, errors.New("prompt: must be a string, token ids, or a batch of one")
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// Bytes is the approximate tokenizer: the prompt's text (each chat message's
// role and content, separated) packed four bytes to a pseudo-token.
type Bytes struct{}

// Tokenize implements Tokenizer.
func (Bytes) Tokenize(_ context.Context, _ string, p openai.Prompt) ([]uint32, error) {
	if err := checkPrompt(p); err != nil {
		return nil, err
	}
	var text []byte
	if p.Chat {
		var msgs []chatMessage
		if err := json.Unmarshal(p.Messages, &msgs); err != nil {
			return nil, fmt.Errorf("messages: %w", err)
		}
		for _, m := range msgs {
			t, err := messageText(m.Content)
			if err != nil {
				return nil, err
			}
			text = append(text, m.Role...)
			text = append(text, 0)
			text = append(text, t...)
			text = append(text, 0)
		}
	} else {
		text = p.Prompt
	}
	out := make([]uint32, 0, (len(text)+3)/4)
	for i := 0; i < len(text); i += 4 {
		var v uint32
		for j := i; j < i+4 && j < len(text); j++ {
			v = v<<8 | uint32(text[j])
		}
		out = append(out, v)
	}
	return out, nil
}
