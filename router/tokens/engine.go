package tokens

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/scoring"
)

// Replica is one engine instance that can tokenize for a model.
type Replica struct {
	Address string // host:port of its OpenAI API
	Engine  string // oasis_engine
}

// ReplicaSource lists the healthy replicas of a model.
type ReplicaSource func(model string) []Replica

// tokenizePath is the engine's tokenize endpoint (vLLM and TensorRT-LLM
// serve /tokenize; SGLang serves /v1/tokenize).
func tokenizePath(engine string) string {
	if engine == "sglang" {
		return "/v1/tokenize"
	}
	return "/tokenize"
}

func servesTokenize(engine string) bool {
	switch engine {
	case "vllm", "sglang", "trtllm", "sim", llamaCpp:
		return true
	}
	return false
}

// EngineConfig tunes an Engine tokenizer.
type EngineConfig struct {
	Replicas ReplicaSource
	Client   *http.Client
	// CacheTokens bounds the cache by total cached token ids (default 8M,
	// about 32 MiB).
	CacheTokens int
	// Timeout bounds one round trip (default 2s).
	Timeout time.Duration
	// MaxTokens bounds the token ids the router reads from one /tokenize
	// answer (default DefaultMaxTokens): the longest max_model_len it
	// expects. An answer is also bounded by its prompt (answerLimit).
	MaxTokens int
	// RefusedFor keeps a replica whose answer was refused out of the
	// rotation for this long (default 30s), so a misbehaving engine costs
	// one round trip per period, not one per prompt.
	RefusedFor time.Duration
	// Metrics, when set, counts refused answers in EngineAnswerRefused.
	Metrics *metrics.Metrics
}

// DefaultMaxTokens is above the context window (max_model_len) of the
// models engines serve: a prompt longer than its engine's window is refused
// by the engine, so its tokens are worth nothing to routing.
const DefaultMaxTokens = 1 << 20

// Bounds of a /tokenize answer (answerLimit): every prompt byte is at most
// one token (byte-level BPE, byte fallback) plus templateTokens for the
// chat template and special tokens; each id is at most idBytes of JSON
// ("4294967295, "), and the other members (count, max_model_len) fit in
// answerSlack bytes.
const (
	templateTokens = 4096
	idBytes        = 12
	answerSlack    = 4096
)

// ErrAnswerRefused means an engine's /tokenize answer was refused unread
// past its bound; the error is an *AnswerError.
var ErrAnswerRefused = errors.New("tokenize answer refused")

// AnswerError is a /tokenize answer the router refused: more bytes or
// token ids than the prompt can tokenize to.
type AnswerError struct {
	URL    string
	Reason string // "too_large" (bytes) or "too_many_tokens"
	Limit  int64
}

func (e *AnswerError) Error() string {
	return fmt.Sprintf("%s: answer refused (%s, limit %d)", e.URL, e.Reason, e.Limit)
}

func (e *AnswerError) Unwrap() error { return ErrAnswerRefused }

// answerLimit is the most token ids, and bytes, an answer to payload may
// hold.
func (e *Engine) answerLimit(payload []byte) (tokens int, bytes int64) {
	tokens = min(e.cfg.MaxTokens, len(payload)+templateTokens)
	return tokens, int64(tokens)*idBytes + answerSlack
}

// Engine tokenizes through a replica's /tokenize, with a cache.
type Engine struct {
	cfg  EngineConfig
	next atomic.Uint64

	mu       sync.Mutex
	entries  map[[32]byte]*list.Element
	lru      *list.List // of *cacheEntry, most recent at front
	size     int
	inflight map[[32]byte]*call
	refused  map[string]time.Time // replica address → out of the rotation until

	hits, misses atomic.Int64
}

type cacheEntry struct {
	key    [32]byte
	tokens []uint32
}

type call struct {
	done   chan struct{}
	tokens []uint32
	err    error
}

// NewEngine returns an engine tokenizer.
func NewEngine(cfg EngineConfig) *Engine {
	if cfg.Client == nil {
		cfg.Client = &http.Client{}
	}
	if cfg.CacheTokens <= 0 {
		cfg.CacheTokens = 8 << 20
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	if cfg.RefusedFor <= 0 {
		cfg.RefusedFor = 30 * time.Second
	}
	return &Engine{cfg: cfg, entries: map[[32]byte]*list.Element{}, lru: list.New(), inflight: map[[32]byte]*call{},
		refused: map[string]time.Time{}}
}

// Tokenize implements Tokenizer. The /tokenize request carries the prompt's
// raw values as the client sent them, and its bytes are the cache key.
func (e *Engine) Tokenize(ctx context.Context, model string, p openai.Prompt) ([]uint32, error) {
	if err := checkPrompt(p); err != nil {
		return nil, err
	}
	payload := tokenizePayload(model, p)
	key := sha256.Sum256(payload)

	e.mu.Lock()
	if el, ok := e.entries[key]; ok {
		e.lru.MoveToFront(el)
		toks := el.Value.(*cacheEntry).tokens
		e.mu.Unlock()
		e.hits.Add(1)
		return toks, nil
	}
	if c, ok := e.inflight[key]; ok {
		e.mu.Unlock()
		e.hits.Add(1)
		select {
		case <-c.done:
			return c.tokens, c.err
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	c := &call{done: make(chan struct{})}
	e.inflight[key] = c
	e.mu.Unlock()
	e.misses.Add(1)

	c.tokens, c.err = e.roundTrip(ctx, model, p, payload)
	e.mu.Lock()
	delete(e.inflight, key)
	if c.err == nil {
		e.add(key, c.tokens)
	}
	e.mu.Unlock()
	close(c.done)
	return c.tokens, c.err
}

// tokenizePayload is the body of a /tokenize request for p: the members of
// the client's body the engine's tokenizer reads, appended as they came
// rather than decoded and encoded again.
func tokenizePayload(model string, p openai.Prompt) []byte {
	const flags = len(`,"add_generation_prompt":false,"add_special_tokens":false}`)
	b := make([]byte, 0, len(`{"model":,"messages":`)+len(model)+2+len(p.Messages)+len(p.Prompt)+flags)
	b = append(b, `{"model":`...)
	b = appendJSONString(b, model)
	if p.Chat {
		b = append(b, `,"messages":`...)
		b = append(b, p.Messages...)
		b = appendFlag(b, "add_generation_prompt", p.AddGenerationPrompt)
	} else {
		b = append(b, `,"prompt":`...)
		b = append(b, p.Prompt...)
	}
	b = appendFlag(b, "add_special_tokens", p.AddSpecialTokens)
	return append(b, '}')
}

// appendFlag appends the member key: f unless f is unset, so that the
// engine applies its own default.
func appendFlag(b []byte, key string, f openai.Flag) []byte {
	if f != openai.FlagTrue && f != openai.FlagFalse {
		return b
	}
	b = append(b, `,"`...)
	b = append(b, key...)
	b = append(b, `":`...)
	return strconv.AppendBool(b, f == openai.FlagTrue)
}

// appendJSONString appends s as a JSON string. Model names need no escapes;
// any other name goes through encoding/json.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c == '"' || c == '\\' || c >= utf8.RuneSelf {
			q, _ := json.Marshal(s) // a string always marshals
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func (e *Engine) add(key [32]byte, toks []uint32) {
	if len(toks) > e.cfg.CacheTokens {
		return
	}
	e.entries[key] = e.lru.PushFront(&cacheEntry{key: key, tokens: toks})
	e.size += len(toks)
	for e.size > e.cfg.CacheTokens {
		el := e.lru.Back()
		ce := el.Value.(*cacheEntry)
		e.lru.Remove(el)
		delete(e.entries, ce.key)
		e.size -= len(ce.tokens)
	}
}

// roundTrip asks replicas in rotation, moving on after a failure; at most
// three tries. Replicas whose answers were refused lately are left out.
func (e *Engine) roundTrip(ctx context.Context, model string, p openai.Prompt, payload []byte) ([]uint32, error) {
	var reps []Replica
	refused := 0
	now := time.Now()
	for _, r := range e.cfg.Replicas(model) {
		switch {
		case !servesTokenize(r.Engine):
		case e.refusedLately(r.Address, now):
			refused++
		default:
			reps = append(reps, r)
		}
	}
	if len(reps) == 0 {
		if refused > 0 {
			return nil, fmt.Errorf("tokenizing for %q: every replica's answers were refused lately: %w", model, ErrAnswerRefused)
		}
		return nil, fmt.Errorf("tokenizing for %q: no healthy replica", model)
	}
	start := e.next.Add(1)
	var lastErr error
	for i := 0; i < min(3, len(reps)); i++ {
		r := reps[(int(start)+i)%len(reps)]
		var toks []uint32
		var err error
		if r.Engine == llamaCpp {
			toks, err = e.askLlamaCpp(ctx, r, p, payload)
		} else {
			toks, err = e.ask(ctx, r, payload)
		}
		if err == nil {
			return toks, nil
		}
		if errors.Is(err, ErrAnswerRefused) {
			e.refuse(r)
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("tokenizing for %q: %w", model, lastErr)
}

// refusedLately reports whether the replica at addr had an answer refused
// less than RefusedFor ago.
func (e *Engine) refusedLately(addr string, now time.Time) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	until, ok := e.refused[addr]
	if ok && !now.Before(until) {
		delete(e.refused, addr)
		return false
	}
	return ok
}

// refuse counts a refused answer of r and keeps r out of the rotation for
// RefusedFor. The map holds only replicas refused within that period.
func (e *Engine) refuse(r Replica) {
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.EngineAnswerRefused.WithLabelValues(metrics.EngineLabel(r.Engine), "tokenize").Inc()
	}
	now := time.Now()
	e.mu.Lock()
	defer e.mu.Unlock()
	for addr, until := range e.refused {
		if !now.Before(until) {
			delete(e.refused, addr)
		}
	}
	e.refused[r.Address] = now.Add(e.cfg.RefusedFor)
}

func (e *Engine) ask(ctx context.Context, r Replica, payload []byte) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	return e.tokenize(ctx, "http://"+r.Address+tokenizePath(r.Engine), payload, payload)
}

// post sends body to url and returns the answer's body, refused unread
// (an *AnswerError) past maxBytes.
func (e *Engine) post(ctx context.Context, url string, body []byte, maxBytes int64) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
		return nil, fmt.Errorf("POST %s: status %d: %.200s", url, resp.StatusCode, b)
	}
	if resp.ContentLength > maxBytes {
		return nil, &AnswerError{URL: url, Reason: "too_large", Limit: maxBytes}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBytes+1))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", url, err)
	}
	if int64(len(b)) > maxBytes {
		return nil, &AnswerError{URL: url, Reason: "too_large", Limit: maxBytes}
	}
	return b, nil
}

// tokenize posts body to an engine's tokenize endpoint and reads the token
// ids of its answer, bounded by what prompt (the client's request, as the
// cache keys it) can tokenize to.
func (e *Engine) tokenize(ctx context.Context, url string, body, prompt []byte) ([]uint32, error) {
	maxTokens, maxBytes := e.answerLimit(prompt)
	answer, err := e.post(ctx, url, body, maxBytes)
	if err != nil {
		return nil, err
	}
	var out struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(answer, &out); err != nil {
		return nil, fmt.Errorf("decoding %s response: %w", url, err)
	}
	if len(out.Tokens) > maxTokens {
		return nil, &AnswerError{URL: url, Reason: "too_many_tokens", Limit: int64(maxTokens)}
	}
	toks := make([]uint32, len(out.Tokens))
	for i, t := range out.Tokens {
		toks[i] = uint32(t)
	}
	return toks, nil
}

// Auto picks a tokenizer per model from the engines serving it: Sim when they
// are all oasis-sim, Engine when one of them serves /tokenize, Bytes otherwise.
type Auto struct {
	Replicas ReplicaSource
	Engine   *Engine

	tokenizeReq func(context.Context, *scoring.Request) ([]uint32, error) // a.tokenizeRequest, bound once by NewAuto
}

// NewAuto returns an Auto over replicas, with an Engine tokenizer using client.
func NewAuto(replicas ReplicaSource, client *http.Client) *Auto {
	return NewAutoEngine(EngineConfig{Replicas: replicas, Client: client})
}

// NewAutoEngine returns an Auto over cfg.Replicas, with an Engine tokenizer
// of cfg.
func NewAutoEngine(cfg EngineConfig) *Auto {
	a := &Auto{Replicas: cfg.Replicas, Engine: NewEngine(cfg)}
	a.tokenizeReq = a.tokenizeRequest
	return a
}

// Mode names the tokenizer Auto uses for model: "sim", "engine" or "bytes".
func (a *Auto) Mode(model string) string {
	reps := a.Replicas(model)
	if len(reps) == 0 {
		return "bytes"
	}
	sim := true
	for _, r := range reps {
		if r.Engine != "sim" {
			sim = false
		}
	}
	if sim {
		return "sim"
	}
	for _, r := range reps {
		if servesTokenize(r.Engine) {
			return "engine"
		}
	}
	return "bytes"
}

// Tokenize implements Tokenizer. When the engines' answers are refused
// (ErrAnswerRefused: larger than the prompt can tokenize to), it falls back
// to Bytes: approximate learning stays self-consistent, and the ttft term
// still gets the prompt's length.
func (a *Auto) Tokenize(ctx context.Context, model string, p openai.Prompt) ([]uint32, error) {
	switch a.Mode(model) {
	case "sim":
		return Sim{}.Tokenize(ctx, model, p)
	case "engine":
		toks, err := a.Engine.Tokenize(ctx, model, p)
		if !errors.Is(err, ErrAnswerRefused) {
			return toks, err
		}
	}
	return Bytes{}.Tokenize(ctx, model, p)
}

// Prepare sets req.Tokenize, for the gateway's Options.Prepare hook. It runs
// for every request: an Auto from NewAuto hands out one func bound once, no
// closure allocated per request.
func (a *Auto) Prepare(req *scoring.Request) {
	if a.tokenizeReq != nil {
		req.Tokenize = a.tokenizeReq
		return
	}
	req.Tokenize = a.tokenizeRequest
}

// tokenizeRequest tokenizes r's prompt for r's model (scoring.Request.Tokenize).
func (a *Auto) tokenizeRequest(ctx context.Context, r *scoring.Request) ([]uint32, error) {
	return a.Tokenize(ctx, r.Model, r.Prompt)
}
