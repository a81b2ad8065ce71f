package server

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"

	"github.com/oasis-llm/oasis/internal/tokenizer"
	"github.com/oasis-llm/oasis/sim/engine"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// maxBody bounds request bodies (vLLM has no limit; 64 MiB is far beyond any prompt
// that fits a context window).
const maxBody = 64 << 20

type apiError struct {
	status int
	typ    string
	msg    string
	param  any
}

func (e *apiError) Error() string { return e.msg }

func badRequest(param any, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, typ: "BadRequestError", msg: fmt.Sprintf(format, args...), param: param}
}

// writeError writes vLLM's ErrorResponse: {"error":{"message","type","param","code"}}.
func writeError(w http.ResponseWriter, status int, typ, msg string, param any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{
		"message": msg, "type": typ, "param": param, "code": status,
	}})
}

func writeAPIError(w http.ResponseWriter, err error) {
	var ae *apiError
	if errors.As(err, &ae) {
		writeError(w, ae.status, ae.typ, ae.msg, ae.param)
		return
	}
	writeError(w, http.StatusInternalServerError, "InternalServerError", err.Error(), nil)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

func decodeBody(r *http.Request, v any) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return badRequest(nil, "reading request body: %v", err)
	}
	if len(body) > maxBody {
		return badRequest(nil, "request body larger than %d bytes", maxBody)
	}
	if err := json.Unmarshal(body, v); err != nil {
		return badRequest(nil, "invalid JSON body: %v", err)
	}
	return nil
}

// apiRequest holds the fields of both completion endpoints that oasis-sim models.
// Other OpenAI/vLLM fields (temperature, top_p, presence_penalty, ...) are accepted
// and have no effect, as sampling is simulated.
type apiRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            []chatMessage   `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage         bool `json:"include_usage"`
		ContinuousUsageStats bool `json:"continuous_usage_stats"`
	} `json:"stream_options"`
	Logprobs               json.RawMessage `json:"logprobs"`
	TopLogprobs            *int            `json:"top_logprobs"`
	Stop                   json.RawMessage `json:"stop"`
	StopTokenIDs           []int32         `json:"stop_token_ids"`
	IncludeStopStrInOutput bool            `json:"include_stop_str_in_output"`
	Seed                   *int64          `json:"seed"`
	N                      *int            `json:"n"`
	Temperature            *float64        `json:"temperature"`
	Echo                   bool            `json:"echo"`
	SkipSpecialTokens      *bool           `json:"skip_special_tokens"`
	AddGenerationPrompt    *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage   bool            `json:"continue_final_message"`
	ReturnTokenIDs         bool            `json:"return_token_ids"`
	AddSpecialTokens       *bool           `json:"add_special_tokens"`
	KVTransferParams       json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost          json.RawMessage `json:"bootstrap_host"`
	BootstrapPort          json.RawMessage `json:"bootstrap_port"`
	BootstrapRoom          json.RawMessage `json:"bootstrap_room"`
	// OasisLogprob fixes every sampled token's log probability (see
	// confidence.go); an oasis-sim extension.
	OasisLogprob *float64 `json:"oasis_logprob"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// text joins a message's content as vLLM's "string" content format does: a string, or
// the text parts of an array joined with newlines.
func (m chatMessage) text() (string, error) {
	if len(m.Content) == 0 || string(m.Content) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(m.Content, &s); err == nil {
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(m.Content, &parts); err != nil {
		return "", badRequest("messages", "message content must be a string or an array of content parts")
	}
	var texts []string
	for _, p := range parts {
		if p.Type != "text" {
			return "", badRequest("messages", "content part type %q is not supported by oasis-sim (text only)", p.Type)
		}
		texts = append(texts, p.Text)
	}
	return strings.Join(texts, "\n"), nil
}

func (s *Server) checkModel(name string) error {
	if name == "" || s.served[name] || s.adapterOf(name) != "" {
		return nil
	}
	return &apiError{status: http.StatusNotFound, typ: "NotFoundError", msg: fmt.Sprintf("The model `%s` does not exist.", name), param: "model"}
}

func (s *Server) responseModel(name string) string {
	if name == "" {
		return s.modelName
	}
	return name
}

// chatMessages converts request messages for the chat template.
func chatMessages(msgs []chatMessage) ([]tokenizer.Message, error) {
	if len(msgs) == 0 {
		return nil, badRequest("messages", "messages must not be empty")
	}
	out := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest("messages", "messages[%d].role is required", i)
		}
		t, err := m.text()
		if err != nil {
			return nil, err
		}
		out[i] = tokenizer.Message{Role: m.Role, Content: t}
	}
	return out, nil
}

// promptTokens tokenizes a completion prompt: a string, or token ids; batches of one
// are unwrapped (oasis-sim serves one prompt per request).
func promptTokens(raw json.RawMessage, addSpecial bool) ([]int32, string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, "", badRequest("prompt", "prompt is required")
	}
	first, second := firstBytes(raw)
	var str string
	if first == '"' && json.Unmarshal(raw, &str) == nil {
		if addSpecial {
			return tokenizer.EncodePrompt(str), str, nil
		}
		return tokenizer.Encode(nil, str), str, nil
	}
	if first == '[' && second != '"' && second != '[' {
		if ids, ok := parseIntArray(raw); ok {
			return checkIDs(ids)
		}
		var ids []int32
		if json.Unmarshal(raw, &ids) == nil {
			return checkIDs(ids)
		}
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		if len(strs) != 1 {
			return nil, "", badRequest("prompt", "oasis-sim serves one prompt per request, got %d", len(strs))
		}
		return promptTokens(mustJSON(strs[0]), addSpecial)
	}
	var idss [][]int32
	if err := json.Unmarshal(raw, &idss); err == nil {
		if len(idss) != 1 {
			return nil, "", badRequest("prompt", "oasis-sim serves one prompt per request, got %d", len(idss))
		}
		return checkIDs(idss[0])
	}
	return nil, "", badRequest("prompt", "prompt must be a string, an array of token ids, or a batch of one")
}

// parseIntArray parses a JSON array of small non-negative integers, the common form
// of token-id prompts, without reflection; anything else reports !ok.
func parseIntArray(raw []byte) ([]int32, bool) {
	ids := make([]int32, 0, len(raw)/6)
	i, n := 0, len(raw)
	skip := func() {
		for i < n && (raw[i] == ' ' || raw[i] == '\t' || raw[i] == '\n' || raw[i] == '\r') {
			i++
		}
	}
	skip()
	if i >= n || raw[i] != '[' {
		return nil, false
	}
	i++
	skip()
	if i < n && raw[i] == ']' {
		i++
		skip()
		return ids, i == n
	}
	for {
		skip()
		start := i
		var v int64
		for i < n && raw[i] >= '0' && raw[i] <= '9' {
			v = v*10 + int64(raw[i]-'0')
			if v > 1<<31-1 {
				return nil, false
			}
			i++
		}
		if i == start {
			return nil, false
		}
		ids = append(ids, int32(v))
		skip()
		if i >= n {
			return nil, false
		}
		switch raw[i] {
		case ',':
			i++
		case ']':
			i++
			skip()
			return ids, i == n
		default:
			return nil, false
		}
	}
}

// firstBytes returns the first and second non-space bytes of a JSON value.
func firstBytes(raw []byte) (byte, byte) {
	var out [2]byte
	n := 0
	for _, c := range raw {
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			continue
		}
		out[n] = c
		if n++; n == 2 {
			break
		}
	}
	return out[0], out[1]
}

func checkIDs(ids []int32) ([]int32, string, error) {
	for _, id := range ids {
		if !tokenizer.Valid(id) {
			return nil, "", badRequest("prompt", "Token id %d is out of vocabulary", id)
		}
	}
	return ids, tokenizer.Decode(ids, false), nil
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

func parseStop(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, badRequest("stop", "stop must be a string or an array of strings")
	}
	return many, nil
}

// prepared is a validated request ready to submit.
type prepared struct {
	chat         bool
	model        string
	prompt       []int32
	promptText   string
	gen          *generation
	logprobs     bool
	topLogprobs  int
	stream       bool
	includeUsage bool
	continuous   bool
	echo         bool
	tokenIDs     bool             // return_token_ids: prompt_token_ids and token_ids in the answer
	vllm         *vllmKV          // kv_transfer_params
	sglang       *sglangBootstrap // bootstrap_* fields
	holdKey      string           // a prefill leg's KV is held under this key
	kvOut        map[string]any   // kv_transfer_params of a vLLM prefill leg's answer
}

func (s *Server) prepare(r *http.Request, chat bool) (*prepared, error) {
	var req apiRequest
	if err := decodeBody(r, &req); err != nil {
		return nil, err
	}
	if err := s.checkModel(req.Model); err != nil {
		return nil, err
	}
	p := &prepared{chat: chat, model: s.responseModel(req.Model), stream: req.Stream, echo: req.Echo && !chat}
	if req.StreamOptions != nil {
		if !req.Stream {
			return nil, badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
		}
		p.includeUsage = req.StreamOptions.IncludeUsage
		p.continuous = req.StreamOptions.ContinuousUsageStats
	}
	if req.N != nil && *req.N != 1 {
		return nil, badRequest("n", "oasis-sim supports n=1 only, got n=%d", *req.N)
	}
	if chat {
		msgs, err := chatMessages(req.Messages)
		if err != nil {
			return nil, err
		}
		if p.prompt, err = chatPrompt(msgs, &req); err != nil {
			return nil, err
		}
		// Chat logprobs: bool + top_logprobs (0..20).
		if len(req.Logprobs) > 0 && string(req.Logprobs) != "null" {
			if err := json.Unmarshal(req.Logprobs, &p.logprobs); err != nil {
				return nil, badRequest("logprobs", "logprobs must be a boolean for chat completions")
			}
		}
		if req.TopLogprobs != nil {
			if *req.TopLogprobs < 0 || *req.TopLogprobs > 20 {
				return nil, badRequest("top_logprobs", "top_logprobs must be between 0 and 20, got %d", *req.TopLogprobs)
			}
			if *req.TopLogprobs > 0 && !p.logprobs {
				return nil, badRequest("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
			}
			p.topLogprobs = *req.TopLogprobs
		}
	} else {
		if len(req.Messages) > 0 {
			return nil, badRequest("messages", "messages are only accepted by /v1/chat/completions")
		}
		addSpecial := req.AddSpecialTokens == nil || *req.AddSpecialTokens
		var err error
		if p.prompt, p.promptText, err = promptTokens(req.Prompt, addSpecial); err != nil {
			return nil, err
		}
		// Completion logprobs: integer count of alternatives (0..20).
		if len(req.Logprobs) > 0 && string(req.Logprobs) != "null" {
			var n int
			if err := json.Unmarshal(req.Logprobs, &n); err != nil || n < 0 || n > 20 {
				return nil, badRequest("logprobs", "logprobs must be an integer between 0 and 20")
			}
			p.logprobs, p.topLogprobs = true, n
		}
	}
	if len(p.prompt) == 0 {
		return nil, badRequest("prompt", "The prompt is empty.")
	}
	maxLen := s.cfg.MaxModelLen
	maxTokens := req.MaxTokens
	if req.MaxCompletionTokens != nil {
		maxTokens = req.MaxCompletionTokens
	}
	if maxTokens == nil && !chat {
		// OpenAI's and vLLM's completions default.
		sixteen := 16
		maxTokens = &sixteen
	}
	if maxTokens != nil && *maxTokens < 1 {
		return nil, badRequest("max_tokens", "max_tokens must be at least 1, got %d.", *maxTokens)
	}
	if len(p.prompt) >= maxLen {
		return nil, badRequest("messages", "This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.", maxLen, len(p.prompt))
	}
	if maxTokens != nil && len(p.prompt)+*maxTokens > maxLen {
		return nil, badRequest("max_tokens", "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
			maxLen, len(p.prompt)+*maxTokens, len(p.prompt), *maxTokens)
	}
	stop, err := parseStop(req.Stop)
	if err != nil {
		return nil, err
	}
	for _, id := range req.StopTokenIDs {
		if !tokenizer.Valid(id) {
			return nil, badRequest("stop_token_ids", "stop token id %d is out of vocabulary", id)
		}
	}
	if maxTokens, err = s.preparePD(p, &req, maxTokens); err != nil {
		return nil, err
	}
	gp := genParams{
		limit:        maxLen - len(p.prompt),
		stop:         stop,
		stopTokenIDs: req.StopTokenIDs,
		includeStop:  req.IncludeStopStrInOutput,
		skipSpecial:  req.SkipSpecialTokens == nil || *req.SkipSpecialTokens,
		wantLogprobs: p.logprobs,
		topLogprobs:  p.topLogprobs,
		fixedLogprob: confidence(&req),
		rng:          s.requestRNG(p.prompt, req.Seed, req.Temperature),
		greedy:       greedySeed(req.Seed, req.Temperature),
		prompt:       p.prompt,
	}
	p.tokenIDs = req.ReturnTokenIDs
	if maxTokens != nil {
		gp.maxTokens, gp.explicitMax = *maxTokens, true
	}
	p.gen = s.vocab.generate(gp)
	return p, nil
}

// preparePD parses the disaggregation fields (see pd.go) and returns the request's
// max_tokens: 1 on an SGLang prefill leg, which emits the first token only (the
// decode server generates the rest).
func (s *Server) preparePD(p *prepared, req *apiRequest, maxTokens *int) (*int, error) {
	var err error
	if p.vllm, err = parseKVTransferParams(req.KVTransferParams); err != nil {
		return nil, err
	}
	mode := s.cfg.PD.SGLangMode
	if mode == "" {
		return maxTokens, nil
	}
	if p.sglang, err = parseBootstrap(req.BootstrapHost, req.BootstrapPort, req.BootstrapRoom, mode == ModeDecode); err != nil {
		return nil, err
	}
	if p.sglang != nil && mode == ModePrefill {
		p.holdKey = roomKey(p.sglang.room)
		one := 1
		return &one, nil
	}
	return maxTokens, nil
}

// requestRNG seeds a request's random source. A seed, or temperature 0 (greedy),
// makes the output a function of the prompt (and seed); otherwise it also depends on
// the server's --seed and a per-request counter.
func (s *Server) requestRNG(prompt []int32, seed *int64, temp *float64) *rand.Rand {
	var h uint64 = 1469598103934665603
	for _, t := range prompt {
		h = (h ^ uint64(uint32(t))) * 1099511628211
	}
	switch {
	case seed != nil:
		return rand.New(rand.NewPCG(h, uint64(*seed)))
	case temp != nil && *temp == 0:
		return rand.New(rand.NewPCG(h, 0))
	}
	s.mu.Lock()
	s.nextID++
	n := s.nextID
	s.mu.Unlock()
	return rand.New(rand.NewPCG(h^s.cfg.Seed, n))
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	s.serveGeneration(w, r, false)
}
func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) { s.serveGeneration(w, r, true) }

func (s *Server) serveGeneration(w http.ResponseWriter, r *http.Request, chat bool) {
	p, err := s.prepare(r, chat)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	arrival := s.simTime()
	remote, err := s.receiveKV(r.Context(), p)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	rid := requestID(r, chat)
	if p.vllm != nil && p.vllm.remoteDecode && s.cfg.KVTransfer {
		// Without a --kv-transfer-config vLLM ignores kv_transfer_params.
		// Unique even when clients reuse X-Request-Id, as vLLM's internal ids are.
		p.holdKey = reqKey(fmt.Sprintf("%s-%08x", rid, rand.Uint32()))
	}
	st, err := s.submit(p.prompt, p.gen, submitOpts{remote: remote, hold: p.holdKey != "", arrival: arrival,
		lora: s.adapterOf(p.model)})
	if err != nil {
		writeAPIError(w, badRequest(nil, "%v", err))
		return
	}
	w.Header().Set("X-Request-Id", rid)
	if p.stream {
		s.streamResponse(w, r, p, st, rid)
		return
	}
	// Wait for the whole generation; the client leaving aborts it.
	cached := 0
	for {
		select {
		case <-st.signal:
		case <-r.Context().Done():
			s.abort(st)
			return
		}
		outs, done := st.take(nil)
		for _, o := range outs {
			if o.Index == 0 {
				cached = o.CachedTokens
			}
		}
		if done {
			break
		}
	}
	s.finishPrefill(p, st)
	resp := s.fullResponse(p, rid, cached)
	if p.tokenIDs {
		addTokenIDs(resp, p)
	}
	writeJSON(w, resp)
}

func requestID(r *http.Request, chat bool) string {
	base := r.Header.Get("X-Request-Id")
	if base == "" {
		var b [16]byte
		binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
		binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
		base = fmt.Sprintf("%x", b)
	}
	if chat {
		return "chatcmpl-" + base
	}
	return "cmpl-" + base
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails map[string]int `json:"prompt_tokens_details"`
}

func mkUsage(prompt, completion, cached int) *usage {
	return &usage{PromptTokens: prompt, CompletionTokens: completion, TotalTokens: prompt + completion,
		PromptTokensDetails: map[string]int{"cached_tokens": cached}}
}

// finishPrefill holds a finished prefill leg's KV for its decode leg and, for vLLM,
// builds the kv_transfer_params of the answer with the keys of NixlConnector's
// request_finished (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py).
func (s *Server) finishPrefill(p *prepared, st *stream) {
	if p.holdKey == "" {
		return
	}
	blocks := s.holdKV(p.holdKey, st, p.prompt)
	if p.vllm == nil {
		return
	}
	host := s.cfg.PD.SideChannelHost
	if host == "" {
		host = s.cfg.Host
	}
	p.kvOut = map[string]any{
		"do_remote_prefill": true,
		"do_remote_decode":  false,
		"remote_block_ids":  blocks,
		"remote_engine_id":  s.cfg.PD.EngineID,
		"remote_request_id": strings.TrimPrefix(p.holdKey, "req:"),
		"remote_host":       host,
		"remote_port":       s.cfg.PD.SideChannelPort,
		"tp_size":           1,
	}
}

func (s *Server) fullResponse(p *prepared, rid string, cached int) map[string]any {
	g := p.gen
	u := mkUsage(len(p.prompt), len(g.tokens), cached)
	choice := map[string]any{"index": 0, "finish_reason": g.finishReason, "stop_reason": g.stopReason, "logprobs": nil}
	if p.chat {
		choice["message"] = map[string]any{"role": "assistant", "content": g.text, "tool_calls": []any{}, "reasoning_content": nil}
		if p.logprobs {
			choice["logprobs"] = map[string]any{"content": chatLogprobs(g, 0, len(g.tokens), p.topLogprobs)}
		}
		return map[string]any{
			"id": rid, "object": "chat.completion", "created": s.created, "model": p.model,
			"choices": []any{choice}, "usage": u, "prompt_logprobs": nil, "kv_transfer_params": p.kvOut,
		}
	}
	text := g.text
	if p.echo {
		text = p.promptText + text
	}
	choice["text"] = text
	if p.logprobs {
		choice["logprobs"] = completionLogprobs(g, 0, len(g.tokens), p.topLogprobs, 0)
	}
	return map[string]any{
		"id": rid, "object": "text_completion", "created": s.created, "model": p.model,
		"choices": []any{choice}, "usage": u, "kv_transfer_params": p.kvOut,
	}
}

// tokenText is token i's share of the final text.
func tokenText(g *generation, i int) string {
	start := 0
	if i > 0 {
		start = g.textEnd[i-1]
	}
	return g.text[start:g.textEnd[i]]
}

func chatLogprobs(g *generation, from, to, top int) []any {
	out := make([]any, 0, to-from)
	for i := from; i < to; i++ {
		tok := tokenizer.TokenString(g.tokens[i])
		e := map[string]any{"token": tok, "logprob": g.logprobs[i], "bytes": bytesOf(tokenizer.TokenBytes(g.tokens[i]))}
		alts := []any{}
		if top > 0 {
			for _, a := range g.top[i] {
				alts = append(alts, map[string]any{"token": tokenizer.TokenString(a.token), "logprob": a.logprob, "bytes": bytesOf(tokenizer.TokenBytes(a.token))})
			}
		}
		e["top_logprobs"] = alts
		out = append(out, e)
	}
	return out
}

func bytesOf(b []byte) []int {
	out := make([]int, len(b))
	for i, c := range b {
		out[i] = int(c)
	}
	return out
}

func completionLogprobs(g *generation, from, to, top, offset int) map[string]any {
	tokens := make([]string, 0, to-from)
	lps := make([]float64, 0, to-from)
	offsets := make([]int, 0, to-from)
	tops := make([]any, 0, to-from)
	for i := from; i < to; i++ {
		tokens = append(tokens, tokenizer.TokenString(g.tokens[i]))
		lps = append(lps, g.logprobs[i])
		start := 0
		if i > 0 {
			start = g.textEnd[i-1]
		}
		offsets = append(offsets, offset+start)
		if top > 0 {
			m := map[string]float64{}
			for _, a := range g.top[i] {
				m[tokenizer.TokenString(a.token)] = a.logprob
			}
			tops = append(tops, m)
		} else {
			tops = append(tops, nil)
		}
	}
	return map[string]any{"text_offset": offsets, "token_logprobs": lps, "tokens": tokens, "top_logprobs": tops}
}

// streamResponse writes the SSE stream: "data: {json}\n\n" per chunk, an optional usage
// chunk, then "data: [DONE]\n\n". Tokens that arrive together are flushed together.
func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, p *prepared, st *stream, rid string) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	bw := bufio.NewWriterSize(w, 4096)
	g := p.gen
	object := "text_completion"
	if p.chat {
		object = "chat.completion.chunk"
	}
	head := fmt.Sprintf(`{"id":%q,"object":%q,"created":%d,"model":%s,"choices":[`, rid, object, s.created, mustJSON(p.model))
	writeChunk := func(choice any, u *usage) {
		bw.WriteString("data: ")
		bw.WriteString(head)
		switch c := choice.(type) {
		case nil:
		case json.RawMessage:
			bw.Write(c)
		default:
			b, _ := json.Marshal(c)
			bw.Write(b)
		}
		bw.WriteString("]")
		if u != nil {
			b, _ := json.Marshal(u)
			bw.WriteString(`,"usage":`)
			bw.Write(b)
		}
		bw.WriteString("}\n\n")
	}
	if p.chat {
		plain := head
		if p.tokenIDs { // the first chunk carries the prompt's ids, at its top level
			head = promptIDsHead(head, p.prompt)
		}
		writeChunk(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant", "content": ""}, "logprobs": nil, "finish_reason": nil}, nil)
		head = plain
	}
	var buf []engine.Output
	var scratch []byte
	cached := 0
	for {
		err := bw.Flush()
		if err == nil {
			err = rc.Flush()
		}
		if err != nil {
			// The client is gone: stop generating for it.
			s.abort(st)
			return
		}
		select {
		case <-st.signal:
		case <-r.Context().Done():
			s.abort(st)
			return
		}
		var done bool
		buf, done = st.take(buf)
		for _, o := range buf {
			i := o.Index
			if i == 0 {
				cached = o.CachedTokens
			}
			text := tokenText(g, i)
			if i == 0 && p.echo {
				text = p.promptText + text
			}
			var u *usage
			if p.includeUsage && p.continuous {
				u = mkUsage(len(p.prompt), i+1, cached)
			}
			if !p.logprobs {
				// Hot path: hand-encoded choice, same JSON as the map below.
				scratch = appendChoice(scratch[:0], p.chat, text, o.Finished, g)
				if p.tokenIDs {
					writeChunk(chunkIDs(json.RawMessage(scratch), p, i), u)
					continue
				}
				writeChunk(json.RawMessage(scratch), u)
				continue
			}
			choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": nil}
			if p.chat {
				choice["delta"] = map[string]any{"content": text}
				choice["logprobs"] = map[string]any{"content": chatLogprobs(g, i, i+1, p.topLogprobs)}
			} else {
				choice["text"] = text
				choice["stop_reason"] = nil
				choice["logprobs"] = completionLogprobs(g, i, i+1, p.topLogprobs, 0)
			}
			if o.Finished {
				choice["finish_reason"] = g.finishReason
				choice["stop_reason"] = g.stopReason
			}
			if p.tokenIDs {
				chunkIDs(choice, p, i)
			}
			writeChunk(choice, u)
		}
		if done {
			break
		}
	}
	s.finishPrefill(p, st)
	if p.includeUsage {
		writeChunk(nil, mkUsage(len(p.prompt), len(g.tokens), cached))
	}
	bw.WriteString("data: [DONE]\n\n")
	bw.Flush()
	_ = rc.Flush()
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) {
	data := make([]any, 0, len(s.cfg.ServedModelNames))
	for _, n := range s.cfg.ServedModelNames {
		data = append(data, map[string]any{
			"id": n, "object": "model", "created": s.created, "owned_by": "vllm", "root": s.cfg.Model,
			"parent": nil, "max_model_len": s.cfg.MaxModelLen,
			"permission": []any{map[string]any{"id": "modelperm-oasis-sim", "object": "model_permission", "created": s.created,
				"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true, "allow_search_indices": false,
				"allow_view": true, "allow_fine_tuning": false, "organization": "*", "group": nil, "is_blocking": false}},
		})
	}
	for _, m := range append(slices.Clone(s.cfg.LoRAModules), s.loras.list()...) {
		data = append(data, map[string]any{
			"id": m.Name, "object": "model", "created": s.created, "owned_by": "vllm", "root": m.Path,
			"parent": s.modelName, "max_model_len": nil, "permission": []any{},
		})
	}
	writeJSON(w, map[string]any{"object": "list", "data": data})
}

func (s *Server) handleVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, map[string]any{"version": s.cfg.Version})
}

// handleTokenize is vLLM's POST /tokenize: {"prompt"} or {"messages"} in,
// {"count","max_model_len","tokens","token_strs"} out.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model               string          `json:"model"`
		Prompt              json.RawMessage `json:"prompt"`
		Messages            []chatMessage   `json:"messages"`
		AddSpecialTokens    *bool           `json:"add_special_tokens"`
		AddGenerationPrompt *bool           `json:"add_generation_prompt"`
		ReturnTokenStrs     bool            `json:"return_token_strs"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeAPIError(w, err)
		return
	}
	var ids []int32
	switch {
	case req.Messages != nil:
		msgs, err := chatMessages(req.Messages)
		if err != nil {
			writeAPIError(w, err)
			return
		}
		ids = tokenizer.EncodeChat(msgs, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
	case len(req.Prompt) > 0:
		var text string
		if err := json.Unmarshal(req.Prompt, &text); err != nil {
			writeAPIError(w, badRequest("prompt", "prompt must be a string"))
			return
		}
		if req.AddSpecialTokens == nil || *req.AddSpecialTokens {
			ids = tokenizer.EncodePrompt(text)
		} else {
			ids = tokenizer.Encode(nil, text)
		}
	default:
		writeAPIError(w, badRequest(nil, "either prompt or messages is required"))
		return
	}
	var strs any
	if req.ReturnTokenStrs {
		ss := make([]string, len(ids))
		for i, id := range ids {
			ss[i] = tokenizer.TokenString(id)
		}
		strs = ss
	}
	if ids == nil {
		ids = []int32{}
	}
	writeJSON(w, map[string]any{"count": len(ids), "max_model_len": s.cfg.MaxModelLen, "tokens": ids, "token_strs": strs})
}

func (s *Server) handleDetokenize(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model  string  `json:"model"`
		Tokens []int32 `json:"tokens"`
	}
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	if err := s.checkModel(req.Model); err != nil {
		writeAPIError(w, err)
		return
	}
	for _, id := range req.Tokens {
		if !tokenizer.Valid(id) {
			writeAPIError(w, badRequest("tokens", "Token id %d is out of vocabulary", id))
			return
		}
	}
	writeJSON(w, map[string]any{"prompt": tokenizer.Decode(req.Tokens, false)})
}

func (s *Server) handleResetPrefixCache(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	ok := s.eng.ResetPrefixCache()
	events := s.eng.DrainEvents()
	s.mu.Unlock()
	if len(events) > 0 && s.pub != nil {
		if _, err := s.pub.Publish(kvEventsBatch(events)); err != nil {
			s.log.Warn("publishing kv events failed", "error", err)
		}
	}
	if !ok {
		writeError(w, http.StatusBadRequest, "BadRequestError", "cannot reset the prefix cache while requests are running", nil)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{})
}

// appendChoice encodes a streamed choice without logprobs.
func appendChoice(b []byte, chat bool, text string, finished bool, g *generation) []byte {
	b = append(b, `{"index":0,`...)
	if chat {
		b = append(b, `"delta":{"content":`...)
		b = appendJSONString(b, text)
		b = append(b, '}')
	} else {
		b = append(b, `"text":`...)
		b = appendJSONString(b, text)
	}
	b = append(b, `,"logprobs":null,"finish_reason":`...)
	if finished {
		b = appendJSONString(b, g.finishReason)
		b = append(b, `,"stop_reason":`...)
		sr, _ := json.Marshal(g.stopReason)
		b = append(b, sr...)
	} else {
		b = append(b, "null"...)
		if !chat {
			b = append(b, `,"stop_reason":null`...)
		}
	}
	return append(b, '}')
}

// appendJSONString appends s as a JSON string; non-ASCII or control characters take
// encoding/json's path so the escaping is identical.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}
