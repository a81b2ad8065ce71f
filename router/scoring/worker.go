// Package scoring chooses the engine instance (worker) that serves a request.
//
// A Selector applies one of three policies to the healthy workers of a model:
// round_robin, least_load, or weighted, where each worker's score is
// Σ wᵢ·termᵢ over Terms that each return a value in [0, 1]. Terms live in a
// Registry built once by the router; adding a term is one file that implements
// Term plus one line where the router builds its Registry.
package scoring

import (
	"context"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/openai"
	// Named: scoring's tests have a worker helper.
	rworker "github.com/oasis-llm/oasis/router/worker"
)

// Worker, Live, Signals and Prefill are router/worker's: every layer names
// a worker without importing scoring.
type (
	Worker  = rworker.Worker
	Live    = rworker.Live
	Signals = rworker.Signals
	Prefill = rworker.Prefill
)

// Prefill rate defaults (worker's).
const (
	DefaultPrefillRate = rworker.DefaultPrefillRate
	MinPrefillSample   = rworker.MinPrefillSample
)

// NewLive returns an idle worker's signals (worker.NewLive).
func NewLive() *Live { return rworker.NewLive() }

// Request is what the scoring sees of a client request.
type Request struct {
	Model  string // the body's "model"
	Path   string // e.g. /v1/chat/completions
	Body   []byte // the unmodified client body; do not mutate
	Stream bool
	// Prompt is the body's prompt, parsed with the rest of the body
	// (openai.ParseRequest); its raw values point into Body.
	Prompt openai.Prompt
	// EstimatedTokens approximates prompt + maximum output tokens; the router
	// uses it for its in-flight token count.
	EstimatedTokens int64

	// Tokenize, when set, turns the request's prompt into the model's token
	// ids. Terms never call it directly: PromptTokens runs it at most once per
	// request however many terms ask.
	Tokenize func(ctx context.Context, r *Request) ([]uint32, error)

	// AdapterLoad, when set, is the time worker w needs before it can start
	// on the request: for a LoRA adapter w can load on demand
	// (Worker.Loadable) but does not hold, the expected load time (what is
	// left of it while a load is under way); 0 where w holds or serves the
	// name. The ttft term adds it to w's estimate. The gateway sets it from
	// what its router loaded and measured (router/gateway/adapters.go).
	AdapterLoad func(w *Worker) time.Duration

	tokOnce sync.Once
	tokDone bool
	tokens  []uint32
	tokErr  error

	// What the prefix match found (PrefixTerm.match, run at most once per
	// request and shared by the prefix and ttft terms), kept so the router can
	// count and record the decision without digesting and matching the prompt
	// a second time.
	prefixDone bool
	prefixKeys []uint64
	prefixHits map[string]prefixHit // worker id → its match
}

type prefixHit struct {
	blocks   int     // matched blocks (a prefix), any tier
	weighted float64 // the same, tier-weighted
	keys     int     // request blocks at this worker's block size
	gpu      int32   // of blocks, those in GPU memory
	inflight int32   // of blocks, those only in flight (prefixindex.Match.Inflight)
}

// PrefixResult returns what the prefix match saw for this request: the prompt's
// block keys and how many of them (a prefix) the worker held. ok is false when
// no term matched the request (prefix and ttft not weighted, no tokens).
func (r *Request) PrefixResult(worker string) (keys []uint64, matched int, ok bool) {
	if r.prefixHits == nil {
		return nil, 0, false
	}
	return r.prefixKeys, r.prefixHits[worker].blocks, true
}

// UncachedTokens is the request's prompt length less the tokens the prefix
// match found in w's cache: what w will have to compute before the first
// token. It never tokenizes: without tokens already known (no term asked for
// them) it returns 0, false.
func (r *Request) UncachedTokens(w *Worker) (int64, bool) {
	if !r.tokDone || r.tokErr != nil {
		return 0, false
	}
	return uncached(r, w), true
}

func uncached(r *Request, w *Worker) int64 {
	n := int64(len(r.tokens))
	if h, ok := r.prefixHits[w.ID]; ok {
		n -= int64(h.blocks) * int64(BlockSizeOf(w))
	}
	return max(n, 0)
}

// unconfirmed is uncached counting only the blocks an engine has confirmed
// holding: a copy the router only sent (in flight) does not count.
func unconfirmed(r *Request, w *Worker) int64 {
	n := int64(len(r.tokens))
	if h, ok := r.prefixHits[w.ID]; ok {
		n -= int64(h.blocks-int(h.inflight)) * int64(BlockSizeOf(w))
	}
	return max(n, 0)
}

// PromptTokens returns the prompt's token ids, tokenizing on first use.
// It returns (nil, nil) when the router has no tokenizer for this request.
func (r *Request) PromptTokens(ctx context.Context) ([]uint32, error) {
	if r.Tokenize == nil {
		return nil, nil
	}
	r.tokOnce.Do(func() { r.tokens, r.tokErr = r.Tokenize(ctx, r); r.tokDone = true })
	return r.tokens, r.tokErr
}
