package cascade

import (
	"encoding/json"
	"strconv"

	"github.com/oasis-llm/oasis/router/openai"
)

// An accepted small answer goes to the client as the client asked for it:
// without log probabilities unless requested, and as an event stream (the
// whole answer in one chunk, then the finish, usage when
// stream_options.include_usage, and [DONE]) when the client streams.

// choices are the answer's choices, without log probabilities unless the
// client asked for them.
func (a *Answer) choices() []map[string]json.RawMessage {
	var choices []map[string]json.RawMessage
	_ = json.Unmarshal(a.doc["choices"], &choices) // Read checked it is a list
	if !a.wantsLP {
		for _, c := range choices {
			c["logprobs"] = json.RawMessage("null")
		}
	}
	return choices
}

// JSON is the answer as a JSON body, newline-terminated.
func (a *Answer) JSON() []byte {
	body := a.body
	if !a.wantsLP {
		a.doc["choices"], _ = json.Marshal(a.choices())
		body, _ = json.Marshal(a.doc)
	}
	return append(body, '\n')
}

// Events turns a whole chat or text completion into the events a streamed
// answer would have had.
func (a *Answer) Events(includeUsage bool) []byte {
	object := "text_completion"
	if a.chat {
		object = "chat.completion.chunk"
	}
	var out []byte
	event := func(chs []map[string]json.RawMessage, usage json.RawMessage) {
		ev := map[string]json.RawMessage{"id": a.doc["id"], "object": openai.String(object), "created": a.doc["created"],
			"model": a.doc["model"]}
		ev["choices"], _ = json.Marshal(chs)
		if usage != nil {
			ev["usage"] = usage
		}
		b, _ := json.Marshal(ev)
		out = append(out, "data: "...)
		out = append(out, b...)
		out = append(out, "\n\n"...)
	}
	null := json.RawMessage("null")
	for _, c := range a.choices() {
		if !a.chat {
			event([]map[string]json.RawMessage{c}, nil)
			continue
		}
		first := map[string]json.RawMessage{"index": c["index"], "delta": deltaOf(c["message"]),
			"logprobs": c["logprobs"], "finish_reason": null}
		last := map[string]json.RawMessage{"index": c["index"], "delta": json.RawMessage("{}"),
			"logprobs": null, "finish_reason": c["finish_reason"]}
		if sr, ok := c["stop_reason"]; ok {
			last["stop_reason"] = sr
		}
		event([]map[string]json.RawMessage{first}, nil)
		event([]map[string]json.RawMessage{last}, nil)
	}
	if includeUsage && a.doc["usage"] != nil {
		event([]map[string]json.RawMessage{}, a.doc["usage"])
	}
	return append(out, "data: [DONE]\n\n"...)
}

// deltaOf turns a chat message into a stream delta: the same members, each
// tool call numbered by its index as deltas carry them.
func deltaOf(msg json.RawMessage) json.RawMessage {
	var m map[string]json.RawMessage
	if json.Unmarshal(msg, &m) != nil || m == nil {
		return json.RawMessage("{}")
	}
	var calls []map[string]json.RawMessage
	if json.Unmarshal(m["tool_calls"], &calls) == nil && len(calls) > 0 {
		for i, c := range calls {
			c["index"] = json.RawMessage(strconv.Itoa(i))
		}
		m["tool_calls"], _ = json.Marshal(calls)
	}
	b, _ := json.Marshal(m)
	return b
}
