package tokenizer

import "strings"

// Message is one chat message after its content parts have been joined to text.
type Message struct {
	Role    string
	Content string
}

// RenderChat renders messages with oasis-sim's chat template, which is Llama 3's:
//
//	<|begin_of_text|>
//	for each message: <|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|>
//	if addGenerationPrompt: <|start_header_id|>assistant<|end_header_id|>\n\n
//
// Content is inserted verbatim (Llama 3's template trims it; this one does not, so what
// a client sends is what is cached). The result is tokenized with Encode, without an
// extra BOS, exactly as vLLM tokenizes a rendered chat prompt.
func RenderChat(messages []Message, addGenerationPrompt bool) string {
	var b strings.Builder
	n := len(specialText[BOS-SpecialBase]) + 32
	for _, m := range messages {
		n += len(m.Role) + len(m.Content) + 64
	}
	b.Grow(n)
	b.WriteString(specialText[BOS-SpecialBase])
	for _, m := range messages {
		b.WriteString(specialText[StartHeader-SpecialBase])
		b.WriteString(m.Role)
		b.WriteString(specialText[EndHeader-SpecialBase])
		b.WriteString("\n\n")
		b.WriteString(m.Content)
		b.WriteString(specialText[EOT-SpecialBase])
	}
	if addGenerationPrompt {
		b.WriteString(specialText[StartHeader-SpecialBase])
		b.WriteString("assistant")
		b.WriteString(specialText[EndHeader-SpecialBase])
		b.WriteString("\n\n")
	}
	return b.String()
}

// EncodeChat returns the token ids of the rendered chat prompt: what oasis-sim computes
// for a /v1/chat/completions request (with add_generation_prompt true, its default).
func EncodeChat(messages []Message, addGenerationPrompt bool) []int32 {
	s := RenderChat(messages, addGenerationPrompt)
	return Encode(make([]int32, 0, len(s)/3+8), s)
}
