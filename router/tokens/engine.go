package tokens

import (
	"bytes"
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

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
	case "vllm", "sglang", "trtllm", "sim":
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
	return &Engine{cfg: cfg, entries: map[[32]byte]*list.Element{}, lru: list.New(), inflight: map[[32]byte]*call{}}
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

	c.tokens, c.err = e.roundTrip(ctx, model, payload)
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
// three tries.
func (e *Engine) roundTrip(ctx context.Context, model string, payload []byte) ([]uint32, error) {
	var reps []Replica
	for _, r := range e.cfg.Replicas(model) {
		if servesTokenize(r.Engine) {
			reps = append(reps, r)
		}
	}
	if len(reps) == 0 {
		return nil, fmt.Errorf("tokenizing for %q: no healthy replica", model)
	}
	start := e.next.Add(1)
	var lastErr error
	for i := 0; i < min(3, len(reps)); i++ {
		r := reps[(int(start)+i)%len(reps)]
		toks, err := e.ask(ctx, r, payload)
		if err == nil {
			return toks, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("tokenizing for %q: %w", model, lastErr)
}

func (e *Engine) ask(ctx context.Context, r Replica, payload []byte) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	url := "http://" + r.Address + tokenizePath(r.Engine)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := e.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("POST %s: %w", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("POST %s: status %d: %.200s", url, resp.StatusCode, body)
	}
	var out struct {
		Tokens []int64 `json:"tokens"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("decoding %s response: %w", url, err)
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
	a := &Auto{Replicas: replicas, Engine: NewEngine(EngineConfig{Replicas: replicas, Client: client})}
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

// Tokenize implements Tokenizer.
func (a *Auto) Tokenize(ctx context.Context, model string, p openai.Prompt) ([]uint32, error) {
	switch a.Mode(model) {
	case "sim":
		return Sim{}.Tokenize(ctx, model, p)
	case "engine":
		return a.Engine.Tokenize(ctx, model, p)
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
