package server

// The Responses API as vLLM serves it (vllm/entrypoints/openai/serving_responses.py),
// enough to test a router in front of it: POST /v1/responses generates like a chat
// completion over instructions, the stored conversation of previous_response_id and
// input; the response's id is the request's request_id (vLLM's extra parameter, a
// random resp_ id when absent); with store (the default) it is kept in this process's
// memory, where GET /v1/responses/{id}, .../cancel and a later previous_response_id
// find it. A streamed response's events are written once its generation finished
// (every output_text.delta at once), not token by token. No tools, no background mode.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/sim/engine"
)

// maxStoredResponses bounds the store; the oldest response is dropped first.
const maxStoredResponses = 4096

type responsesRequest struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    *string         `json:"instructions"`
	PreviousID      *string         `json:"previous_response_id"`
	Store           *bool           `json:"store"`
	Stream          bool            `json:"stream"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	RequestID       string          `json:"request_id"`
	Temperature     *float64        `json:"temperature"`
	Seed            *int64          `json:"seed"`
}

type storedResponse struct {
	object  map[string]any
	history []chatMessage // the conversation so far, the answer included
}

// responseStore holds stored responses by id, at most maxStoredResponses.
type responseStore struct {
	mu    sync.Mutex
	items map[string]*storedResponse
	order []string
}

func newResponseStore() *responseStore { return &responseStore{items: map[string]*storedResponse{}} }

func (rs *responseStore) get(id string) *storedResponse {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.items[id]
}

func (rs *responseStore) put(id string, r *storedResponse) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if _, ok := rs.items[id]; !ok {
		rs.order = append(rs.order, id)
	}
	rs.items[id] = r
	for len(rs.order) > maxStoredResponses {
		delete(rs.items, rs.order[0])
		rs.order = rs.order[1:]
	}
}

func responseNotFound(id string) *apiError {
	return &apiError{status: http.StatusNotFound, typ: "invalid_request_error",
		msg: fmt.Sprintf("Response with id '%s' not found.", id)}
}

func (s *Server) handleResponseGet(w http.ResponseWriter, r *http.Request) {
	st := s.responses.get(r.PathValue("id"))
	if st == nil {
		writeAPIError(w, responseNotFound(r.PathValue("id")))
		return
	}
	writeJSON(w, st.object)
}

// handleResponseCancel: only background responses can be cancelled, and the sim runs
// none in the background (vLLM's answer for a finished one).
func (s *Server) handleResponseCancel(w http.ResponseWriter, r *http.Request) {
	if s.responses.get(r.PathValue("id")) == nil {
		writeAPIError(w, responseNotFound(r.PathValue("id")))
		return
	}
	writeAPIError(w, badRequest(nil, "Cannot cancel a synchronous response."))
}

// responseMessages turns input (a string, or a list of message items) into chat
// messages after history.
func responseMessages(req *responsesRequest, history []chatMessage) ([]chatMessage, error) {
	msgs := append([]chatMessage(nil), history...)
	var text string
	if err := json.Unmarshal(req.Input, &text); err == nil {
		return append(msgs, chatMessage{Role: "user", Content: mustJSON(text)}), nil
	}
	var items []struct {
		Type    string          `json:"type"`
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(req.Input, &items); err != nil || len(items) == 0 {
		return nil, badRequest("input", "input must be a string or a non-empty list of messages")
	}
	for i, it := range items {
		if (it.Type != "" && it.Type != "message") || it.Role == "" {
			return nil, badRequest("input", "input[%d]: oasis-sim accepts message items only", i)
		}
		msgs = append(msgs, chatMessage{Role: it.Role, Content: inputContent(it.Content)})
	}
	return msgs, nil
}

// inputContent maps the Responses API's input_text parts to chat text parts.
func inputContent(raw json.RawMessage) json.RawMessage {
	var parts []map[string]any
	if json.Unmarshal(raw, &parts) != nil {
		return raw
	}
	for _, p := range parts {
		if p["type"] == "input_text" || p["type"] == "output_text" {
			p["type"] = "text"
		}
	}
	return mustJSON(parts)
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	var req responsesRequest
	if err := decodeBody(r, &req); err != nil {
		writeAPIError(w, err)
		return
	}
	var history []chatMessage
	if req.PreviousID != nil {
		prev := s.responses.get(*req.PreviousID)
		if prev == nil {
			writeAPIError(w, responseNotFound(*req.PreviousID))
			return
		}
		history = prev.history
	}
	msgs, err := responseMessages(&req, history)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	p, err := s.prepareResponse(r, &req, msgs)
	if err != nil {
		writeAPIError(w, err)
		return
	}
	st, err := s.submit(p.prompt, p.gen, submitOpts{arrival: s.simTime(), lora: s.adapterOf(p.model)})
	if err != nil {
		writeAPIError(w, badRequest(nil, "%v", err))
		return
	}
	cached, ok := s.await(r, st)
	if !ok {
		return
	}
	id := req.RequestID
	if id == "" {
		id = fmt.Sprintf("resp_%016x%016x", rand.Uint64(), rand.Uint64())
	}
	obj := s.responseObject(id, p, &req, cached)
	if req.Store == nil || *req.Store {
		out := append(msgs, chatMessage{Role: "assistant", Content: mustJSON(p.gen.text)})
		s.responses.put(id, &storedResponse{object: obj, history: out})
	}
	w.Header().Set("X-Request-Id", id)
	if req.Stream {
		writeResponseEvents(w, obj, p.gen)
		return
	}
	writeJSON(w, obj)
}

// prepareResponse prepares msgs as a chat completion's generation.
func (s *Server) prepareResponse(r *http.Request, req *responsesRequest, msgs []chatMessage) (*prepared, error) {
	if req.Instructions != nil {
		msgs = append([]chatMessage{{Role: "system", Content: mustJSON(*req.Instructions)}}, msgs...)
	}
	chat := map[string]any{"model": req.Model, "messages": msgs, "max_tokens": req.MaxOutputTokens,
		"temperature": req.Temperature, "seed": req.Seed}
	b, err := json.Marshal(chat)
	if err != nil {
		return nil, err
	}
	cr := r.Clone(r.Context())
	cr.Body, cr.ContentLength = io.NopCloser(bytes.NewReader(b)), int64(len(b))
	return s.prepare(cr, true)
}

// await waits for st's whole generation and returns its cached prompt tokens;
// false when the client left (the generation is aborted).
func (s *Server) await(r *http.Request, st *stream) (int, bool) {
	cached := 0
	var buf []engine.Output
	for {
		select {
		case <-st.signal:
		case <-r.Context().Done():
			s.abort(st)
			return 0, false
		}
		outs, done := st.take(buf)
		for _, o := range outs {
			if o.Index == 0 {
				cached = o.CachedTokens
			}
		}
		if done {
			return cached, true
		}
	}
}

func (s *Server) responseObject(id string, p *prepared, req *responsesRequest, cached int) map[string]any {
	g := p.gen
	status := "completed"
	var incomplete any
	if g.finishReason == "length" {
		status, incomplete = "incomplete", map[string]any{"reason": "max_output_tokens"}
	}
	msg := map[string]any{"type": "message", "id": "msg_" + id[len("resp_"):], "role": "assistant", "status": "completed",
		"content": []any{map[string]any{"type": "output_text", "text": g.text, "annotations": []any{}, "logprobs": nil}}}
	return map[string]any{
		"id": id, "object": "response", "created_at": time.Now().Unix(), "model": p.model, "status": status,
		"output": []any{msg}, "previous_response_id": req.PreviousID, "instructions": req.Instructions,
		"max_output_tokens": req.MaxOutputTokens, "store": req.Store == nil || *req.Store,
		"incomplete_details": incomplete, "error": nil, "metadata": map[string]any{}, "parallel_tool_calls": true,
		"tool_choice": "auto", "tools": []any{}, "temperature": req.Temperature, "top_p": nil, "truncation": "disabled",
		"text": map[string]any{"format": map[string]any{"type": "text"}}, "background": false,
		"usage": map[string]any{"input_tokens": len(p.prompt), "output_tokens": len(g.tokens),
			"total_tokens": len(p.prompt) + len(g.tokens), "input_tokens_details": map[string]any{"cached_tokens": cached},
			"output_tokens_details": map[string]any{"reasoning_tokens": 0}},
	}
}

// writeResponseEvents writes obj as the Responses API's event stream.
func writeResponseEvents(w http.ResponseWriter, obj map[string]any, g *generation) {
	h := w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	seq := 0
	ev := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		fmt.Fprintf(bw, "event: %s\ndata: %s\n\n", typ, mustJSON(fields))
	}
	start := map[string]any{}
	for k, v := range obj {
		start[k] = v
	}
	start["status"], start["output"], start["usage"] = "in_progress", []any{}, nil
	ev("response.created", map[string]any{"response": start})
	ev("response.in_progress", map[string]any{"response": start})
	msg := obj["output"].([]any)[0].(map[string]any)
	id := msg["id"]
	ev("response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{"type": "message", "id": id,
		"role": "assistant", "status": "in_progress", "content": []any{}}})
	part := map[string]any{"type": "output_text", "text": "", "annotations": []any{}}
	ev("response.content_part.added", map[string]any{"output_index": 0, "content_index": 0, "item_id": id, "part": part})
	for i := range g.tokens {
		ev("response.output_text.delta", map[string]any{"output_index": 0, "content_index": 0, "item_id": id,
			"delta": tokenText(g, i), "logprobs": []any{}})
	}
	ev("response.output_text.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": id, "text": g.text,
		"logprobs": []any{}})
	done := msg["content"].([]any)[0]
	ev("response.content_part.done", map[string]any{"output_index": 0, "content_index": 0, "item_id": id, "part": done})
	ev("response.output_item.done", map[string]any{"output_index": 0, "item": msg})
	ev("response.completed", map[string]any{"response": obj})
	_ = bw.Flush()
}
