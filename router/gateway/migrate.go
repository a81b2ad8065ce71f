package gateway

// In-flight migration (issue #37): when the engine of a stream fails after
// the first token — its connection breaks, or it sends nothing for the
// stream_idle timeout — the router continues the same client stream on
// another engine. It asks engines that take them for the token ids they
// generate — vLLM and oasis-sim: return_token_ids (choices[].token_ids and
// prompt_token_ids); llama.cpp's llama-server: return_tokens with verbose
// (__verbose.tokens; its chat chunks carry no ids, so a chat counts its
// tokens by timings_per_token's timings.predicted_n) — relays only whole
// events, and on a failure sends the continuation: a completion's prompt ids
// plus the ids already streamed as a token-id prompt (llama-server: the
// client's prompt followed by those ids, a mixed prompt it tokenizes as the
// original), a chat's messages plus the text already streamed as an open
// final assistant message (continue_final_message, which both take),
// max_tokens reduced by what was sent. A continuation goes to an engine of
// the same kind: token ids are the kind's tokenizer's. The new engine is chosen by the
// model's policy with the continuation's tokens, so the prefix term finds
// an engine holding them. Its events go to the client rewritten as the
// first engine's: the same id and created, no second role chunk, usage
// covering the whole answer. After migration_limit continuations the
// stream ends with the error event as before. Other engines, and one whose
// events carry no token ids, are never migrated from.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Paths a stream can be migrated on.
const (
	pathCompletions = "/v1/completions"
	pathChat        = "/v1/chat/completions"
)

// completionsDefaultMax is vLLM's and OpenAI's max_tokens of a completion
// that sets none: the continuation must ask for the rest of it.
const completionsDefaultMax = 16

// maxTrackedText bounds the text and token ids a stream keeps for its
// continuation (a chat's text, a completion's ids); a longer stream is no
// longer migrated.
const maxTrackedText = 4 << 20

var jsonTrue = json.RawMessage("true")

// migratable reports whether x's stream can be continued on another engine
// when its engine fails: a direct stream of completions or chat to an
// engine that returns token ids (not a hosted API, not another datacenter,
// not a prefill/decode leg) with migration on.
func migratable(x *exchange, wk *scoring.Worker) bool {
	p := x.req.Path
	return x.fields.Stream && (p == pathCompletions || p == pathChat) && x.pol.MigrationLimit > 0 &&
		x.remote == nil && takesTokenIDs(wk) && !x.remotePrefill()
}

// takesTokenIDs reports whether wk's engine returns the ids of the tokens
// it streams and takes token ids and continue_final_message back.
func takesTokenIDs(wk *scoring.Worker) bool { return idsKindOf(wk) != idsNone }

// idsKind is how an engine returns token ids and takes a continuation.
type idsKind uint8

const (
	idsNone  idsKind = iota
	idsVLLM          // return_token_ids; token-id prompts
	idsLlama         // return_tokens + verbose: __verbose.tokens; mixed prompts; chat: timings_per_token
)

// idsKindOf is the kind of wk's engine by its oasis_engine meta: vLLM
// (0.10.2 and later) and oasis-sim as vLLM, llama.cpp's llama-server.
// Others are never sent the fields: some refuse unknown fields
// (TensorRT-LLM's OpenAI server answers 400).
func idsKindOf(wk *scoring.Worker) idsKind {
	if wk.Upstream != "" {
		return idsNone
	}
	switch wk.Engine {
	case engineVLLM, engineSim:
		return idsVLLM
	case engineLlamaCpp:
		return idsLlama
	}
	return idsNone
}

// oasis_engine values of engines that take token ids.
const (
	engineVLLM     = "vllm"
	engineSim      = "sim"
	engineLlamaCpp = "llama_cpp"
)

// clientIDsKey is the member a client sets itself to get the members the
// router otherwise adds and takes out of the events of kind's engine.
func clientIDsKey(kind idsKind, chat bool) string {
	switch {
	case kind != idsLlama:
		return "return_token_ids"
	case chat:
		return "timings_per_token"
	}
	return "verbose"
}

// withIDFields returns the body x's attempt to wk sends asking wk's engine
// for the token ids (or, llama-server's chat, the token counts) a
// migration needs: body as it is when x is not migratable to wk. The last
// of a repeated key wins, so the members are appended.
func withIDFields(x *exchange, wk *scoring.Worker, body []byte) []byte {
	if !migratable(x, wk) {
		return body
	}
	kind, chat := idsKindOf(wk), x.req.Path == pathChat
	if kind == idsLlama && !chat {
		body = openai.AppendMember(body, "return_tokens", jsonTrue)
	}
	if key := clientIDsKey(kind, chat); !asksItself(x.body, key) {
		body = openai.AppendMember(body, key, jsonTrue)
	}
	return body
}

// migrateSignal is what relay.run returns instead of ending a stream whose
// engine failed when the stream can be continued.
type migrateSignal struct {
	reason string // metrics.MigrationEngineFailed or MigrationStreamIdle
	err    error  // the engine's failure
}

func (m *migrateSignal) Error() string { return "stream to be migrated: " + m.err.Error() }
func (m *migrateSignal) Unwrap() error { return m.err }

// errNotContinuable: the stream cannot be sent to another engine.
var errNotContinuable = errors.New("the stream cannot be continued")

// streamTrack follows a stream that may be migrated: what the client has
// received, and how to rewrite a continuation's events.
type streamTrack struct {
	chat      bool
	kind      idsKind
	clientIDs bool // the client set clientIDsKey itself: its members stay
	ok        bool // every event with output carried token ids (llama-server's chat: a token count)
	finished  bool // an event with a finish_reason reached the client
	ngen      int  // tokens the client has received: len(gen), or llama-server's count
	held      int  // llama-server: the last ids of gen, whose text it held back (stop strings)

	pieces []llamaPiece // llama-server: text where the ids of its tokens were not streamed

	prompt  []int32 // the engine's prompt_token_ids
	gen     []int32 // ids of the tokens the client has received
	text    []byte  // chat: the content the client has received
	id      []byte  // the first engine's "id" member, as JSON
	created []byte  // its "created" member, as JSON

	leg     int // 0: the first engine; n: the nth continuation
	legBase int // len(gen) when the current leg started
	legID   []byte
	legCrt  []byte

	pending []byte      // the start of an event not complete yet
	out     []byte      // filter's result
	scan    streamChunk // scanChunk's result, reused
}

func newStreamTrack(x *exchange, wk *scoring.Worker) *streamTrack {
	chat, kind := x.req.Path == pathChat, idsKindOf(wk)
	t := &streamTrack{chat: chat, kind: kind, clientIDs: asksItself(x.body, clientIDsKey(kind, chat))}
	// A chat that continues its own final message would need its text
	// joined to that message; it keeps today's behaviour.
	t.ok = !t.chat || !bytes.Contains(x.body, []byte(`"continue_final_message"`))
	return t
}

// asksItself reports whether a client body sets the member key true (and
// so gets the members the router would otherwise take out).
func asksItself(body []byte, key string) bool {
	if !bytes.Contains(body, []byte(`"`+key+`"`)) {
		return false
	}
	var v map[string]json.RawMessage
	return json.Unmarshal(body, &v) == nil && string(bytes.TrimSpace(v[key])) == "true"
}

// startLeg prepares for a continuation's events.
func (t *streamTrack) startLeg() {
	t.leg++
	t.legBase = t.ngen
	t.legID, t.legCrt, t.pending = nil, nil, t.pending[:0]
}

// streamChunk is what the tracker reads of one streamed event.
type streamChunk struct {
	ID             json.RawMessage `json:"id"`
	Created        json.RawMessage `json:"created"`
	PromptTokenIDs []int32         `json:"prompt_token_ids"` // chat: top level
	Choices        []streamChoice  `json:"choices"`
	Usage          json.RawMessage `json:"usage"`
}

// streamChoice is one choice of a streamed event.
type streamChoice struct {
	Index          int     `json:"index"`
	Output         []byte  `json:"-"` // scanChunk: text or content, undecoded (it has no escapes)
	Text           string  `json:"text"`
	TokenIDs       []int32 `json:"token_ids"`
	PromptTokenIDs []int32 `json:"prompt_token_ids"` // completions
	FinishReason   *string `json:"finish_reason"`
	Delta          struct {
		Role      string          `json:"role"`
		Content   string          `json:"content"`
		ToolCalls json.RawMessage `json:"tool_calls"`
		Reasoning json.RawMessage `json:"reasoning_content"`
	} `json:"delta"`
}

// filter takes the engine's bytes and returns what the client gets now:
// whole events only (a failure must not leave half an event behind), the
// router's token-id members taken out, a continuation's events rewritten.
// The result is valid until the next call.
func (t *streamTrack) filter(data []byte) []byte {
	if !t.ok && t.leg == 0 && len(t.pending) == 0 && !bytes.Contains(data, t.marker()) {
		return data // never to be migrated, nothing to take out: as it came
	}
	t.out = t.out[:0]
	buf := data
	if len(t.pending) > 0 {
		t.pending = append(t.pending, data...)
		buf = t.pending
	}
	for {
		i := bytes.Index(buf, []byte("\n\n"))
		if i < 0 {
			break
		}
		t.out = t.event(t.out, buf[:i+2])
		buf = buf[i+2:]
	}
	// Keep the rest: a copy when it points into data, which the caller reuses.
	rest := append(t.pending[:0:0], buf...)
	t.pending = append(t.pending[:0], rest...)
	return t.out
}

// event appends ev (one whole event) to out as the client gets it.
func (t *streamTrack) event(out, ev []byte) []byte {
	data, ok := bytes.CutPrefix(ev, []byte("data:"))
	data = bytes.TrimSpace(data)
	if !ok || len(data) == 0 || data[0] != '{' {
		return append(out, ev...) // [DONE], comments, other fields
	}
	if t.kind == idsLlama {
		return t.llamaEvent(out, ev, data)
	}
	if t.leg == 0 && !bytes.Contains(data, []byte("token_ids")) {
		t.skim(data) // no ids: nothing to keep or take out, no need to parse
		return append(out, ev...)
	}
	c := &t.scan
	if !scanChunk(data, c) {
		c = &streamChunk{}
		if json.Unmarshal(data, c) != nil {
			t.ok = false
			return append(out, ev...)
		}
	}
	if t.leg > 0 && t.roleOnly(c) {
		return out // the client had its role chunk from the first engine
	}
	t.read(c)
	switch {
	case t.leg > 0 && len(c.Usage) > 0 && string(c.Usage) != "null":
		return t.rewriteWhole(out, data, c)
	case t.leg > 0:
		ev = removeMember(t.asFirst(ev), "prompt_token_ids")
	case !t.clientIDs:
		ev = removeMember(ev, "prompt_token_ids")
	}
	if !t.clientIDs {
		ev = removeMember(ev, "token_ids")
	}
	return append(out, ev...)
}

// asFirst rewrites a continuation's event ev with the first engine's id
// and created (ids are JSON strings: the closing quote ends the match).
func (t *streamTrack) asFirst(ev []byte) []byte {
	ev = bytes.Replace(ev, append([]byte(`"id":`), t.legID...), append([]byte(`"id":`), t.id...), 1)
	return bytes.Replace(ev, append([]byte(`"created":`), t.legCrt...), append([]byte(`"created":`), t.created...), 1)
}

// marker is what every event of the engine that carries ids contains.
func (t *streamTrack) marker() []byte {
	switch {
	case t.kind != idsLlama:
		return []byte("token_ids")
	case t.chat:
		return []byte(`"timings":`)
	}
	return []byte(`"__verbose":`)
}

// skim reads what matters of a first-leg event without token ids: output
// in it (text or content not empty) means the engine does not return ids
// and the stream cannot be continued; a finish reason ends it.
func (t *streamTrack) skim(data []byte) {
	for _, k := range [][]byte{[]byte(`"text":"`), []byte(`"content":"`)} {
		if i := bytes.Index(data, k); i >= 0 && i+len(k) < len(data) && data[i+len(k)] != '"' {
			t.ok = false
		}
	}
	if bytes.Contains(data, []byte(`"finish_reason":"`)) {
		t.finished = true
	}
}

// output is a choice's text or content.
func (ch *streamChoice) output() []byte {
	if ch.Output != nil {
		return ch.Output
	}
	if ch.Text != "" {
		return []byte(ch.Text)
	}
	return []byte(ch.Delta.Content)
}

// roleOnly reports whether c is a chat stream's role chunk.
func (t *streamTrack) roleOnly(c *streamChunk) bool {
	return t.chat && len(c.Choices) == 1 && c.Choices[0].Delta.Role != "" && len(c.Choices[0].output()) == 0 &&
		len(c.Choices[0].TokenIDs) == 0 && c.Choices[0].FinishReason == nil
}

// read records what c gives the client.
func (t *streamTrack) read(c *streamChunk) {
	if t.leg == 0 {
		if t.id == nil {
			t.id, t.created = append([]byte(nil), c.ID...), append([]byte(nil), c.Created...)
		}
		t.prompt = append(t.prompt, c.PromptTokenIDs...)
	} else if t.legID == nil {
		t.legID, t.legCrt = append([]byte(nil), c.ID...), append([]byte(nil), c.Created...)
	}
	for i := range c.Choices {
		ch := &c.Choices[i]
		if t.leg == 0 {
			t.prompt = append(t.prompt, ch.PromptTokenIDs...)
		}
		out := ch.output()
		if ch.Index != 0 || len(ch.Delta.ToolCalls) > 0 && string(ch.Delta.ToolCalls) != "null" ||
			len(ch.Delta.Reasoning) > 0 && string(ch.Delta.Reasoning) != "null" || len(out) > 0 && len(ch.TokenIDs) == 0 && t.countsIDs() {
			t.ok = false // n > 1, tool calls, reasoning, or no ids: not continuable from text and ids
		}
		t.gen = append(t.gen, ch.TokenIDs...)
		if t.chat {
			t.text = append(t.text, out...)
		}
		if ch.FinishReason != nil {
			t.finished = true
		}
	}
	if t.countsIDs() {
		t.ngen = len(t.gen)
	}
	if len(t.gen)+len(t.text) > maxTrackedText {
		t.ok = false
	}
}

// rewriteWhole re-encodes a continuation's event that carries usage: the
// first engine's id and created, usage counting the tokens generated before
// this leg as completion tokens (the leg's engine counted them as prompt).
func (t *streamTrack) rewriteWhole(out, data []byte, c *streamChunk) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(data, &m) != nil {
		return out
	}
	m["id"], m["created"] = t.id, t.created
	delete(m, "prompt_token_ids")
	if t.kind == idsLlama && !t.clientIDs {
		delete(m, "__verbose")
		delete(m, "timings") // the leg's, not the stream's
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(c.Usage, &u) == nil {
		shift := int64(t.legBase)
		adjust := func(k string, d int64) {
			var n int64
			if json.Unmarshal(u[k], &n) == nil {
				u[k] = json.RawMessage(strconv.FormatInt(n+d, 10))
			}
		}
		adjust("prompt_tokens", -shift)
		adjust("completion_tokens", shift)
		m["usage"], _ = json.Marshal(u)
	}
	b, err := json.Marshal(m)
	if err != nil {
		return out
	}
	out = append(out, "data: "...)
	out = append(out, b...)
	if !t.clientIDs {
		out = removeMember(out, "token_ids")
	}
	return append(out, "\n\n"...)
}

// removeMember takes every member named key whose value is an array or
// null out of the JSON in b (in place). A key inside a string cannot match:
// its quotes are escaped there.
func removeMember(b []byte, key string) []byte {
	pat := []byte(`"` + key + `":`)
	for {
		i := bytes.Index(b, pat)
		if i < 0 {
			return b
		}
		end := i + len(pat)
		switch {
		case bytes.HasPrefix(b[end:], []byte("null")):
			end += 4
		case end < len(b) && b[end] == '[':
			j := bytes.IndexByte(b[end:], ']')
			if j < 0 {
				return b
			}
			end += j + 1
		default:
			return b
		}
		start := i
		if start > 0 && b[start-1] == ',' {
			start--
		} else if end < len(b) && b[end] == ',' {
			end++
		}
		b = append(b[:start], b[end:]...)
	}
}

// continuable reports whether the stream can go on elsewhere.
func (t *streamTrack) continuable() bool {
	return t.ok && !t.finished && (t.chat || t.kind == idsLlama || len(t.prompt) > 0 || len(t.gen) == 0)
}

// continuation builds the exchange of the stream's next leg: the request
// the engine gets and the one the policy scores (its tokens: the prompt and
// the tokens generated so far, for the prefix term).
func (t *streamTrack) continuation(x *exchange) (*exchange, error) {
	t.dropHeld()
	set := map[string]json.RawMessage{clientIDsKey(t.kind, t.chat): jsonTrue}
	if n, ok := t.remaining(x); ok {
		if n < 1 {
			return nil, errNotContinuable
		}
		key := "max_tokens"
		if bytes.Contains(x.body, []byte(`"max_completion_tokens"`)) {
			key = "max_completion_tokens"
		}
		set[key] = json.RawMessage(strconv.Itoa(n))
	}
	if t.chat {
		msgs, err := withAssistant(x.fields.Prompt.Messages, t.text)
		if err != nil {
			return nil, err
		}
		set["messages"], set["continue_final_message"], set["add_generation_prompt"] = msgs, jsonTrue, json.RawMessage("false")
	} else if t.kind == idsLlama {
		p, err := llamaPrompt(x.fields.Prompt.Prompt, t.gen, t.pieces)
		if err != nil {
			return nil, err
		}
		set["prompt"], set["return_tokens"] = p, jsonTrue
	} else {
		ids, _ := json.Marshal(append(append(make([]int32, 0, len(t.prompt)+len(t.gen)), t.prompt...), t.gen...))
		set["prompt"], set["echo"] = ids, json.RawMessage("false")
	}
	body, err := openai.WithFields(x.body, set)
	if err != nil {
		return nil, err
	}
	f, err := openai.ParseRequest(x.req.Path, body)
	if err != nil {
		return nil, err
	}
	req := &scoring.Request{Model: x.req.Model, Path: x.req.Path, Body: body, Stream: true, Prompt: f.Prompt,
		EstimatedTokens: x.req.EstimatedTokens, Tokenize: x.req.Tokenize, AdapterLoad: x.req.AdapterLoad}
	if len(t.prompt) > 0 {
		ids := make([]uint32, 0, len(t.prompt)+len(t.gen))
		for _, v := range t.prompt {
			ids = append(ids, uint32(v))
		}
		for _, v := range t.gen {
			ids = append(ids, uint32(v))
		}
		req.Tokenize = func(context.Context, *scoring.Request) ([]uint32, error) { return ids, nil }
	}
	return &exchange{req: req, fields: f, body: body, reqID: x.reqID, pol: x.pol}, nil
}

// remaining is the continuation's max_tokens: the client's (a vLLM
// completion's default when it set none) less what was sent; !ok without
// one otherwise.
func (t *streamTrack) remaining(x *exchange) (int, bool) {
	switch {
	case x.fields.HasMaxTokens:
		return x.fields.MaxTokens - t.ngen, true
	case !t.chat && t.kind != idsLlama: // llama-server's default: up to the context's end
		return completionsDefaultMax - t.ngen, true
	}
	return 0, false
}

// withAssistant returns the messages array msgs with an assistant message
// of content text appended. A client that continues its own final message
// already is not continued again.
func withAssistant(msgs json.RawMessage, text []byte) (json.RawMessage, error) {
	m := bytes.TrimSpace(msgs)
	if len(m) < 2 || m[0] != '[' || m[len(m)-1] != ']' {
		return nil, errNotContinuable
	}
	content, err := json.Marshal(string(text))
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(m)+len(content)+40)
	out = append(out, m[:len(m)-1]...)
	if len(bytes.TrimSpace(m[1:len(m)-1])) > 0 {
		out = append(out, ',')
	}
	out = append(out, `{"role":"assistant","content":`...)
	out = append(out, content...)
	return append(out, "}]"...), nil
}
