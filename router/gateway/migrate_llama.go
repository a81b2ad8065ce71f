package gateway

// Migration of llama.cpp's llama-server streams. With return_tokens and
// verbose, each /v1/completions event carries its token ids in
// __verbose.tokens (the OpenAI members carry none); its prompt's ids are in
// no event, so a continuation sends the client's prompt followed by the ids
// streamed, a mixed prompt llama-server tokenizes as it did the original. Two
// tokens have no id in the stream: one whose text ends inside a UTF-8
// character is not sent at all (the next event carries both texts and only
// its own id; __verbose.tokens_predicted shows the gap), so the continuation
// has that event's text in the place of its ids (tokenized again: exact
// where it tokenizes back to the same ids); and the text of one that may
// start a stop string is held back, so ids at the end whose text the client
// has not received are left out of the continuation and generated again.
// Its chat events carry no ids at all: with timings_per_token each carries
// timings.predicted_n, the tokens generated so far, and the continuation is
// the text streamed as an open assistant message (continue_final_message),
// exact where the text tokenizes back to the tokens generated.

import (
	"bytes"
	"context"
	"encoding/json"
)

// llamaChunk is what the tracker reads of one llama-server event.
type llamaChunk struct {
	streamChunk
	Verbose *struct {
		Tokens          []int32 `json:"tokens"`
		TokensPredicted int     `json:"tokens_predicted"`
	} `json:"__verbose"`
	Timings *struct {
		PredictedN int `json:"predicted_n"`
	} `json:"timings"`
}

// resent is the number of tokens the continuation next sends its engine:
// the prompt's ids and the ids generated; for llama-server, whose events
// carry no prompt ids, the continuation's tokens as the router's tokenizer
// counts them (those the policy scored it with), else the tokens generated.
func (t *streamTrack) resent(ctx context.Context, next *exchange) int {
	if t.kind != idsLlama {
		return len(t.prompt) + len(t.gen)
	}
	if ids, err := next.req.PromptTokens(ctx); err == nil && len(ids) > 0 {
		return len(ids)
	}
	return t.ngen
}

// countsIDs reports whether the stream's token count is its token ids:
// all but llama-server's, which counts them itself.
func (t *streamTrack) countsIDs() bool { return t.kind != idsLlama }

// llamaPiece is text in the place of token ids: gen[:at] comes before it.
type llamaPiece struct {
	at   int
	text string
}

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
	if t.chat {
		t.read(&c.streamChunk)
		t.countChat(&c)
	} else {
		t.readCompletion(&c)
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

// readCompletion records a completion's event c: its ids, or its text
// where ids are missing, and the count. t.ngen counts the tokens up to the
// last event with text; the ids of events without text since (held) have
// their text still to come.
func (t *streamTrack) readCompletion(c *llamaChunk) {
	if len(c.Choices) != 1 || c.Verbose == nil {
		t.read(&c.streamChunk)
		t.countChat(c) // no ids: output makes the stream not continuable
		return
	}
	ch := &c.Choices[0]
	out := string(ch.output())
	n := t.legBase + c.Verbose.TokensPredicted
	ch.TokenIDs = c.Verbose.Tokens
	if out != "" && n > t.ngen+t.held+len(ch.TokenIDs) {
		// Tokens whose ids were not streamed: the event's text stands for
		// them, the held ones and its own.
		t.gen = t.gen[:len(t.gen)-t.held]
		t.pieces = append(t.pieces, llamaPiece{at: len(t.gen), text: out})
		ch.TokenIDs = nil
	}
	t.read(&c.streamChunk)
	switch {
	case out != "" || ch.FinishReason != nil:
		t.held, t.ngen = 0, max(n, t.ngen)
	default:
		t.held += len(ch.TokenIDs)
	}
}

// dropHeld leaves the ids whose text the client has not received out of
// the stream: the continuation generates them again.
func (t *streamTrack) dropHeld() {
	t.gen = t.gen[:len(t.gen)-t.held]
	t.held = 0
}

// llamaPrompt is the prompt of a llama-server completion's continuation:
// the client's prompt (a string, token ids, or llama-server's mix of both)
// followed by the ids generated, with pieces of text where ids are
// missing. A batch of prompts, or llama-server's object prompt, is not
// continued.
func llamaPrompt(prompt json.RawMessage, gen []int32, pieces []llamaPiece) (json.RawMessage, error) {
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
	for i := 0; i <= len(gen); i++ {
		for len(pieces) > 0 && pieces[0].at == i {
			v, _ := json.Marshal(pieces[0].text)
			elems, pieces = append(elems, v), pieces[1:]
		}
		if i < len(gen) {
			v, _ := json.Marshal(gen[i])
			elems = append(elems, v)
		}
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
	n := valueEnd(b[end:])
	if n <= 0 {
		return b
	}
	end += n
	start := i
	if start > 0 && b[start-1] == ',' {
		start--
	} else if end < len(b) && b[end] == ',' {
		end++
	}
	return append(b[:start], b[end:]...)
}
