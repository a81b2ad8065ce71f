package gateway

// Migration of llama.cpp's llama-server streams. With return_tokens and
// verbose, each /v1/completions event carries its token ids in
// __verbose.tokens (the OpenAI members carry none); its prompt's ids are in
// no event, so a continuation sends the client's prompt followed by the ids
// streamed, a mixed prompt llama-server tokenizes as it did the original.
// Its chat events carry no ids at all: with timings_per_token each carries
// timings.predicted_n, the tokens generated so far, and the continuation is
// the text streamed as an open assistant message (continue_final_message),
// exact where the text tokenizes back to the tokens generated.

import (
	"bytes"
	"encoding/json"
)

// llamaChunk is what the tracker reads of one llama-server event.
type llamaChunk struct {
	streamChunk
	Verbose *struct {
		Tokens []int32 `json:"tokens"`
	} `json:"__verbose"`
	Timings *struct {
		PredictedN int `json:"predicted_n"`
	} `json:"timings"`
}

// countsIDs reports whether the stream's token count is its token ids:
// all but llama-server's chat.
func (t *streamTrack) countsIDs() bool { return t.kind != idsLlama || !t.chat }

// llamaEvent is event for a llama-server stream: ev the whole event, data
// its JSON payload.
func (t *streamTrack) llamaEvent(out, ev, data []byte) []byte {
	if t.leg == 0 && t.id != nil && !bytes.Contains(data, t.marker()) { // the first event is read for its id
		t.skim(data)
		return append(out, ev...)
	}
	var c llamaChunk
	if json.Unmarshal(data, &c) != nil {
		t.ok = false
		return append(out, ev...)
	}
	if t.leg > 0 && t.roleOnly(&c.streamChunk) {
		return out
	}
	if len(c.Choices) == 1 && c.Verbose != nil {
		c.Choices[0].TokenIDs = c.Verbose.Tokens
	}
	t.read(&c.streamChunk)
	if !t.countsIDs() {
		t.countChat(&c)
	}
	if t.leg > 0 && len(c.Usage) > 0 && string(c.Usage) != "null" {
		return t.rewriteWhole(out, data, &c.streamChunk)
	}
	if t.leg > 0 {
		ev = t.asFirst(ev)
	}
	if !t.clientIDs {
		ev = cutMember(ev, "__verbose")
		if !t.finished { // llama-server's last events have timings of their own
			ev = cutMember(ev, "timings")
		}
	}
	return append(out, ev...)
}

// countChat keeps a chat's token count from c's timings; output without
// them cannot be counted, and the stream is not continued.
func (t *streamTrack) countChat(c *llamaChunk) {
	if c.Timings != nil {
		t.ngen = t.legBase + c.Timings.PredictedN
		return
	}
	for i := range c.Choices {
		if len(c.Choices[i].output()) > 0 {
			t.ok = false
		}
	}
}

// llamaPrompt is the prompt of a llama-server completion's continuation:
// the client's prompt (a string, token ids, or llama-server's mix of both)
// followed by the ids generated. A batch of prompts, or llama-server's
// object prompt, is not continued.
func llamaPrompt(prompt json.RawMessage, gen []int32) (json.RawMessage, error) {
	var elems []json.RawMessage
	p := bytes.TrimSpace(prompt)
	switch {
	case len(p) > 0 && p[0] == '"':
		elems = []json.RawMessage{p}
	case len(p) > 0 && p[0] == '[':
		if json.Unmarshal(p, &elems) != nil || !llamaOnePrompt(elems) {
			return nil, errNotContinuable
		}
	default:
		return nil, errNotContinuable
	}
	for _, id := range gen {
		v, _ := json.Marshal(id)
		elems = append(elems, v)
	}
	return json.Marshal(elems)
}

// llamaOnePrompt reports whether the array elems is one prompt to
// llama-server: not empty, strings and integers only, and one string at
// most when it has no integer (several are a batch).
func llamaOnePrompt(elems []json.RawMessage) bool {
	strs, ints := 0, 0
	for _, e := range elems {
		switch e = bytes.TrimSpace(e); {
		case len(e) > 0 && e[0] == '"':
			strs++
		case len(e) > 0 && (e[0] == '-' || e[0] >= '0' && e[0] <= '9') && !bytes.ContainsAny(e, ".eE"):
			ints++
		default:
			return false
		}
	}
	return len(elems) > 0 && (ints > 0 || strs == 1)
}

// cutMember takes the first member named key, whatever its value, out of
// the JSON in b (in place). A key inside a string cannot match: its quotes
// are escaped there.
func cutMember(b []byte, key string) []byte {
	pat := []byte(`"` + key + `":`)
	i := bytes.Index(b, pat)
	if i < 0 {
		return b
	}
	end := i + len(pat)
	dec := json.NewDecoder(bytes.NewReader(b[end:]))
	var v json.RawMessage
	if dec.Decode(&v) != nil {
		return b
	}
	end += int(dec.InputOffset())
	start := i
	if start > 0 && b[start-1] == ',' {
		start--
	} else if end < len(b) && b[end] == ',' {
		end++
	}
	return append(b[:start], b[end:]...)
}
