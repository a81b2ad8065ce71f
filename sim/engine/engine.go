// Package engine is oasis-sim's model of a vLLM engine core: the V1 scheduler
// (continuous batching, chunked prefill, recompute preemption), the paged KV cache with
// automatic prefix caching, KV events and a step-time model.
//
// The engine is a deterministic state machine with no clock and no goroutines: the
// caller submits requests and calls Step, which returns how long that step would take
// on the simulated GPU and what it produced. The HTTP server drives it in real time
// (sleeping Duration/speed between steps); a cluster simulator can drive thousands of
// engines under a virtual clock. An Engine is not safe for concurrent use.
package engine

import (
	"errors"
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/internal/kvevents"
)

// Config sizes the engine. Zero fields take the defaults of DefaultConfig.
type Config struct {
	// BlockSize is tokens per KV block (vLLM --block-size).
	BlockSize int
	// NumGPUBlocks is the KV cache capacity in blocks.
	NumGPUBlocks int
	// MaxNumSeqs bounds the running batch (vLLM --max-num-seqs).
	MaxNumSeqs int
	// MaxNumBatchedTokens is the token budget of one step (vLLM --max-num-batched-tokens).
	MaxNumBatchedTokens int
	// DisablePrefixCaching turns automatic prefix caching off (vLLM
	// --no-enable-prefix-caching).
	DisablePrefixCaching bool
	// KVEvents makes Step report BlockStored/BlockRemoved/AllBlocksCleared events.
	KVEvents bool
	// CPUBlocks, when positive, adds a CPU-memory tier of that many blocks, as vLLM's
	// native KV offloading: blocks are written through to it, a prefix hit continues
	// into it (paying Timing.PerLoadedToken instead of prefill), and its stores and
	// evictions are KV events with medium "CPU".
	CPUBlocks int
	// DiskBlocks, when positive, adds a disk tier of that many blocks below the
	// CPU tier (oasis-kvcached's SSD tier, through LMCache): every block is
	// written through to it, a hit continues into it at Timing.PerDiskLoadedToken,
	// and its stores and evictions are KV events with medium "DISK".
	DiskBlocks int
	// Timing is the step-time model.
	Timing Timing
}

// Timing is the step-time model: a step that computes P prompt tokens and D decoding
// sequences takes StepBase + P·PerPrefillToken + D·PerDecodeSeq.
//
// Defaults model Llama-3-8B (BF16, 8.03 B parameters = 16.1 GB of weights, 32 layers ×
// 8 KV heads × 128 dims × 2 (K,V) × 2 bytes = 128 KiB of KV per token) on one H100 SXM
// (NVIDIA's published datasheet: 3.35 TB/s HBM3, 989 TFLOPS dense BF16):
//   - StepBase 6 ms: every step streams all weights once, 16.1 GB / 3.35 TB/s = 4.8 ms,
//     at ~80% of peak bandwidth ≈ 6 ms. This gives ~165 tokens/s for a single stream,
//     in line with published vLLM single-stream decode rates for Llama-3-8B on H100.
//   - PerPrefillToken 30 µs: 2 × 8.03 GFLOP per token at ~55% of peak (≈540 TFLOPS),
//     so a 1,000-token prompt adds 30 ms to its step.
//   - PerDecodeSeq 50 µs: each decoding sequence reads its KV cache, 128 KiB × ~1,000
//     tokens of context ≈ 134 MB at ~2.7 TB/s.
//
// The ~80% bandwidth efficiency is taken from a published single-GPU vLLM measurement of
// the same model: Llama-3.1-8B-Instruct BF16 decoding one request at ~75 tokens/s on an
// A100-40GB, 77% of that GPU's 1.555 TB/s roofline (J. Musgrave, "vLLM throughput-latency
// sweep on NVIDIA A100", vLLM 0.23, 1024 in / 128 out). The same efficiency on an H100's
// 3.35 TB/s gives ~160 tokens/s, i.e. the 6 ms step. The other two terms are derived from
// the datasheet and the model's shape, not measured; calibrate all three with the flags
// against your own vLLM measurements.
//
// PerLoadedToken is the cost of bringing one token's KV back from the CPU tier: 128 KiB
// over PCIe Gen5 x16 at ~50 GB/s ≈ 2.6 µs, ten times cheaper than recomputing it.
// PerDiskLoadedToken is the same from the disk tier: 128 KiB from one NVMe Gen4 SSD at
// ~6.5 GB/s ≈ 20 µs (the SSD, not PCIe to the GPU, is the bottleneck).
type Timing struct {
	StepBase           time.Duration
	PerPrefillToken    time.Duration
	PerDecodeSeq       time.Duration
	PerLoadedToken     time.Duration
	PerDiskLoadedToken time.Duration
}

// StepTime is the modelled duration of a step.
func (t Timing) StepTime(prefillTokens, decodeSeqs int) time.Duration {
	return t.StepBase + time.Duration(prefillTokens)*t.PerPrefillToken + time.Duration(decodeSeqs)*t.PerDecodeSeq
}

// DefaultTiming returns the Llama-3-8B on one H100 model described on Timing.
func DefaultTiming() Timing {
	return Timing{StepBase: 6 * time.Millisecond, PerPrefillToken: 30 * time.Microsecond, PerDecodeSeq: 50 * time.Microsecond,
		PerLoadedToken: 2600 * time.Nanosecond, PerDiskLoadedToken: 20 * time.Microsecond}
}

// DefaultConfig returns vLLM's defaults on one 80 GB H100 serving Llama-3-8B through
// the OpenAI server: block size 16, max_num_seqs 1024 and max_num_batched_tokens 8192
// (vLLM V1's defaults for the API server on ≥70 GiB GPUs), and the KV blocks that fit
// at --gpu-memory-utilization 0.9 (see BlocksForMemory).
func DefaultConfig() Config {
	return Config{
		BlockSize:           16,
		NumGPUBlocks:        BlocksForMemory(0.9, 16),
		MaxNumSeqs:          1024,
		MaxNumBatchedTokens: 8192,
		Timing:              DefaultTiming(),
	}
}

// BlocksForMemory is the number of KV blocks vLLM would find for Llama-3-8B BF16 on an
// 80 GB H100 at the given --gpu-memory-utilization: 80 GiB × util, less 16 GiB of
// weights and ~2 GiB of activations and CUDA graphs, divided by 128 KiB per token.
// At 0.9 that is 27,648 blocks of 16 tokens (442k tokens).
func BlocksForMemory(util float64, blockSize int) int {
	const gib = 1 << 30
	avail := 80*gib*util - 18*gib
	if avail <= 0 || blockSize <= 0 {
		return 0
	}
	return int(avail / float64(128*1024*blockSize))
}

func (c *Config) fill() error {
	d := DefaultConfig()
	if c.BlockSize == 0 {
		c.BlockSize = d.BlockSize
	}
	if c.NumGPUBlocks == 0 {
		c.NumGPUBlocks = BlocksForMemory(0.9, c.BlockSize)
	}
	if c.MaxNumSeqs == 0 {
		c.MaxNumSeqs = d.MaxNumSeqs
	}
	if c.MaxNumBatchedTokens == 0 {
		c.MaxNumBatchedTokens = d.MaxNumBatchedTokens
	}
	if c.Timing == (Timing{}) {
		c.Timing = d.Timing
	}
	switch {
	case c.BlockSize < 1:
		return fmt.Errorf("block size %d: must be positive", c.BlockSize)
	case c.NumGPUBlocks < 1:
		return fmt.Errorf("num gpu blocks %d: must be positive", c.NumGPUBlocks)
	case c.MaxNumSeqs < 1:
		return fmt.Errorf("max num seqs %d: must be positive", c.MaxNumSeqs)
	case c.MaxNumBatchedTokens < 1:
		return fmt.Errorf("max num batched tokens %d: must be positive", c.MaxNumBatchedTokens)
	case c.CPUBlocks < 0:
		return fmt.Errorf("cpu blocks %d: must not be negative", c.CPUBlocks)
	case c.DiskBlocks < 0:
		return fmt.Errorf("disk blocks %d: must not be negative", c.DiskBlocks)
	case c.Timing.StepBase < 0 || c.Timing.PerPrefillToken < 0 || c.Timing.PerDecodeSeq < 0 || c.Timing.PerLoadedToken < 0 || c.Timing.PerDiskLoadedToken < 0:
		return errors.New("timing parameters must not be negative")
	}
	return nil
}

// Request is one generation request. The engine does not sample: Output holds the
// tokens the request will produce, in order, and the request finishes after the last
// one (or when aborted). This keeps the engine deterministic and lets the caller decide
// text, stop conditions and seeds.
type Request struct {
	ID     string
	Prompt []int32
	Output []int32
	// RemotePrefill marks a disaggregated decode request whose prompt KV arrives from a
	// prefill engine: its prompt occupies blocks but costs no prefill compute.
	RemotePrefill bool
	// HoldKV keeps the request's blocks allocated after it finishes, for a decode
	// engine to read (vLLM NixlConnector's delay_free_blocks on a prefill leg): they
	// stay until ReleaseHeld. HeldBlocks returns their ids.
	HoldKV bool
	// LoRA is the adapter the request runs under ("" for the base model): its
	// blocks are a cache domain of their own, as vLLM mixes the adapter into
	// its block hashes, and its KV events name it (lora_name).
	LoRA string
}

// Output is one token produced by a step.
type Output struct {
	ID    string
	Token int32
	// Index is the position of Token in the request's Output.
	Index int
	// Finished is set on the request's last token; its blocks are already released.
	Finished bool
	// CachedTokens is, on the first token (Index 0), how many prompt tokens came from
	// the prefix cache.
	CachedTokens int
}

// StepResult is what one step did. The result and its Outputs and Preempted slices are
// reused by the next Step call; Events is a fresh slice the caller may keep.
type StepResult struct {
	// Duration is the modelled GPU time of the step; 0 when nothing was scheduled.
	Duration      time.Duration
	PrefillTokens int
	DecodeSeqs    int
	// LoadedTokens came back from the CPU and disk tiers this step, DiskLoadedTokens
	// of them from disk.
	LoadedTokens     int
	DiskLoadedTokens int
	Outputs          []Output
	// Preempted lists requests evicted to make room (they will be recomputed).
	Preempted []string
	// Events are the KV events of the step (Config.KVEvents).
	Events []kvevents.Event
}

// Stats is a snapshot of the engine's state and cumulative counters.
type Stats struct {
	Running, Waiting int
	// KVUsage is the fraction of blocks not free (vLLM's kv_cache_usage_perc, 0..1).
	KVUsage    float64
	UsedBlocks int
	// HeldBlocks are kept by finished HoldKV requests for a decode engine.
	HeldBlocks    int
	CachedBlocks  int
	NumGPUBlocks  int
	PrefixQueries uint64 // prompt tokens looked up in the prefix cache
	PrefixHits    uint64 // of those, tokens found on the GPU
	// CPUHits counts prompt tokens loaded from the CPU tier (vLLM counts these as
	// connector hits, not prefix-cache hits); CPUCachedBlocks is the tier's fill.
	CPUHits         uint64
	CPUCachedBlocks int
	// DiskHits and DiskCachedBlocks are the same for the disk tier.
	DiskHits         uint64
	DiskCachedBlocks int
	Preemptions      uint64
	Steps            uint64
}

type seqState uint8

const (
	stateWaiting seqState = iota
	stateRunning
	stateFinished
)

type sequence struct {
	req         *Request
	state       seqState
	numComputed int // tokens whose KV is in blocks
	numOut      int // output tokens produced
	blocks      []int32
	numHashed   int      // leading blocks registered in the cache (or found there)
	hashes      []uint64 // chained hashes of full blocks, computed lazily
	reported    bool     // first token reported
	cached      int      // prefix-hit tokens at first scheduling
	scheduled   bool     // cached is set (a preempted request keeps its first count, as vLLM's num_cached_tokens)
}

func (s *sequence) numTokens() int { return len(s.req.Prompt) + s.numOut }

func (s *sequence) token(i int) int32 {
	if i < len(s.req.Prompt) {
		return s.req.Prompt[i]
	}
	return s.req.Output[i-len(s.req.Prompt)]
}

// Engine is the simulated engine core.
type Engine struct {
	cfg     Config
	pool    *blockPool
	cpu     *lruTier // nil without CPU offloading
	disk    *lruTier // nil without a disk tier
	seqs    map[string]*sequence
	waiting []*sequence // FCFS; preempted requests go back to the front
	running []*sequence
	stats   Stats
	res     StepResult
	sched   []scheduled
	held    map[string][]int32 // finished HoldKV requests' blocks
}

type scheduled struct {
	s      *sequence
	tokens int
}

// New returns an engine with an empty cache.
func New(cfg Config) (*Engine, error) {
	if err := cfg.fill(); err != nil {
		return nil, fmt.Errorf("engine config: %w", err)
	}
	e := &Engine{
		cfg:  cfg,
		pool: newBlockPool(cfg.NumGPUBlocks, cfg.KVEvents),
		seqs: make(map[string]*sequence),
	}
	if cfg.CPUBlocks > 0 {
		e.cpu = newLRUTier(cfg.CPUBlocks)
	}
	if cfg.DiskBlocks > 0 {
		e.disk = newLRUTier(cfg.DiskBlocks)
	}
	return e, nil
}

// Config returns the engine's configuration with defaults filled in.
func (e *Engine) Config() Config { return e.cfg }

// Errors returned by Submit.
var (
	ErrDuplicateID = errors.New("request id already in use")
	ErrTooLong     = errors.New("request needs more KV blocks than the engine has")
	ErrEmpty       = errors.New("request has an empty prompt or no output tokens")
)

// Submit queues a request. It fails if the id is in use or the request could never
// fit in the KV cache (prompt plus output larger than every block).
func (e *Engine) Submit(r *Request) error {
	if len(r.Prompt) == 0 || len(r.Output) == 0 {
		return ErrEmpty
	}
	if _, ok := e.seqs[r.ID]; ok {
		return fmt.Errorf("%w: %q", ErrDuplicateID, r.ID)
	}
	if need := cdiv(len(r.Prompt)+len(r.Output), e.cfg.BlockSize); need > e.cfg.NumGPUBlocks {
		return fmt.Errorf("%w: %d blocks needed, %d exist", ErrTooLong, need, e.cfg.NumGPUBlocks)
	}
	s := &sequence{req: r}
	e.seqs[r.ID] = s
	e.waiting = append(e.waiting, s)
	return nil
}

// Abort removes a request (client gone, stop string hit) and frees its blocks. It
// reports whether the request was known.
func (e *Engine) Abort(id string) bool {
	s, ok := e.seqs[id]
	if !ok {
		return false
	}
	e.finish(s)
	if s.state == stateRunning {
		e.running = removeSeq(e.running, s)
	} else {
		e.waiting = removeSeq(e.waiting, s)
	}
	return true
}

func removeSeq(list []*sequence, s *sequence) []*sequence {
	for i, x := range list {
		if x == s {
			copy(list[i:], list[i+1:])
			list[len(list)-1] = nil
			return list[:len(list)-1]
		}
	}
	return list
}

func (e *Engine) finish(s *sequence) {
	if s.req.HoldKV && s.state == stateRunning && s.numOut == len(s.req.Output) {
		if e.held == nil {
			e.held = make(map[string][]int32)
		}
		e.held[s.req.ID] = s.blocks
		s.blocks = nil
	} else {
		e.pool.release(s.blocks)
		s.blocks = s.blocks[:0]
	}
	delete(e.seqs, s.req.ID)
}

// HeldBlocks returns the block ids a finished HoldKV request still holds.
func (e *Engine) HeldBlocks(id string) ([]int32, bool) {
	b, ok := e.held[id]
	return b, ok
}

// ReleaseHeld frees a finished HoldKV request's blocks (the decode engine read them,
// or the hold timed out). It reports whether the request held any.
func (e *Engine) ReleaseHeld(id string) bool {
	b, ok := e.held[id]
	if !ok {
		return false
	}
	delete(e.held, id)
	e.pool.release(b)
	return true
}

// HasWork reports whether a Step would schedule anything.
func (e *Engine) HasWork() bool { return len(e.running) > 0 || len(e.waiting) > 0 }

// Stats returns current state and cumulative counters.
func (e *Engine) Stats() Stats {
	st := e.stats
	st.Running, st.Waiting = len(e.running), len(e.waiting)
	for _, b := range e.held {
		st.HeldBlocks += len(b)
	}
	st.NumGPUBlocks = e.cfg.NumGPUBlocks
	st.UsedBlocks = e.cfg.NumGPUBlocks - e.pool.numFree
	st.KVUsage = float64(st.UsedBlocks) / float64(e.cfg.NumGPUBlocks)
	st.CachedBlocks = e.pool.cached.Len()
	if e.cpu != nil {
		st.CPUCachedBlocks = e.cpu.len()
	}
	if e.disk != nil {
		st.DiskCachedBlocks = e.disk.len()
	}
	return st
}

// ResetPrefixCache drops every cached block, as vLLM's /reset_prefix_cache. It fails
// (returns false) while any request holds blocks.
func (e *Engine) ResetPrefixCache() bool { return e.pool.reset() }

// DrainEvents returns and clears KV events produced outside Step (ResetPrefixCache).
func (e *Engine) DrainEvents() []kvevents.Event {
	ev := e.pool.events
	e.pool.events = nil
	return ev
}

const hashSeed = 0x9e3779b97f4a7c15

// BlockHash is the simulator's block hash: a 64-bit hash chained over the parent
// block's hash and the block's token ids (vLLM's hash_block_tokens with its builtin
// 64-bit hash). The first block's parent is a fixed seed. It is deliberately not
// Oasis's blake3 digest: consumers recompute their own keys from the events' token ids,
// as they must with a real vLLM.
func BlockHash(parent uint64, hasParent bool, tokens []int32) uint64 {
	h := uint64(hashSeed)
	if hasParent {
		h ^= parent
	}
	h = mix(h)
	for _, t := range tokens {
		h = mix(h ^ uint64(uint32(t)))
	}
	return h
}

// loraSeed is the parent of an adapter's first block: the adapter's name
// hashed, so no block of one adapter (or of the base model) matches another's.
func loraSeed(name string) uint64 {
	h := uint64(hashSeed) ^ 0x4c6f5241 // "LoRA"
	for i := 0; i < len(name); i++ {
		h = mix(h ^ uint64(name[i]))
	}
	return h
}

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// hashOf returns the hash of full block i of s, computing the chain up to it.
func (e *Engine) hashOf(s *sequence, i int) uint64 {
	bs := e.cfg.BlockSize
	for len(s.hashes) <= i {
		k := len(s.hashes)
		var parent uint64
		hasParent := k > 0
		if k > 0 {
			parent = s.hashes[k-1]
		} else if s.req.LoRA != "" {
			parent, hasParent = loraSeed(s.req.LoRA), true
		}
		var toks []int32
		if end := (k + 1) * bs; end <= len(s.req.Prompt) {
			toks = s.req.Prompt[k*bs : end]
		} else {
			toks = make([]int32, bs)
			for j := range toks {
				toks[j] = s.token(k*bs + j)
			}
		}
		s.hashes = append(s.hashes, BlockHash(parent, hasParent, toks))
	}
	return s.hashes[i]
}

func cdiv(a, b int) int { return (a + b - 1) / b }

// Step schedules one engine step, applies it and returns what it produced. A step with
// nothing to do returns a zero Duration.
func (e *Engine) Step() *StepResult {
	r := &e.res
	r.Duration, r.PrefillTokens, r.DecodeSeqs, r.LoadedTokens, r.DiskLoadedTokens = 0, 0, 0, 0, 0
	r.Outputs, r.Preempted, r.Events = r.Outputs[:0], r.Preempted[:0], nil
	e.sched = e.sched[:0]
	budget := e.cfg.MaxNumBatchedTokens

	// Running requests first, in order; a request that cannot get a block preempts the
	// most recently admitted running request (vLLM's recompute preemption).
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		s := e.running[i]
		n := min(s.numTokens()-s.numComputed, budget)
		if n <= 0 {
			continue
		}
		ok := false
		for {
			if e.allocate(s, nil, n) {
				ok = true
				break
			}
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == s {
				break
			}
		}
		if !ok {
			break
		}
		e.sched = append(e.sched, scheduled{s, n})
		budget -= n
	}

	// Then waiting requests, FCFS, unless this step had to preempt.
	for !preempted && len(e.waiting) > 0 && len(e.running) < e.cfg.MaxNumSeqs && budget > 0 {
		s := e.waiting[0]
		var hits []int32
		total := s.numTokens()
		if !e.cfg.DisablePrefixCaching {
			// Never hit the last token: it must be computed to produce logits.
			maxBlocks := (total - 1) / e.cfg.BlockSize
			for k := 0; k < maxBlocks; k++ {
				b, ok := e.pool.lookup(e.hashOf(s, k))
				if !ok {
					break
				}
				hits = append(hits, b)
			}
		}
		hitTokens := len(hits) * e.cfg.BlockSize
		loaded, fromDisk := 0, 0
		if (e.cpu != nil || e.disk != nil) && !e.cfg.DisablePrefixCaching {
			// The hit continues into CPU memory, then disk: those blocks are
			// loaded, not recomputed.
			maxBlocks := (total - 1) / e.cfg.BlockSize
			for k := len(hits); k < maxBlocks; k++ {
				h := e.hashOf(s, k)
				if e.cpu == nil || !e.cpu.has(h) {
					if e.disk == nil || !e.disk.has(h) {
						break
					}
					fromDisk += e.cfg.BlockSize
				}
				loaded += e.cfg.BlockSize
			}
		}
		computed := hitTokens + loaded
		if s.req.RemotePrefill && s.numOut == 0 {
			// The prompt's KV arrives from the prefill engine.
			computed = max(hitTokens, len(s.req.Prompt)-1)
		}
		n := min(total-computed, budget)
		s.numComputed = computed
		if !e.allocate(s, hits, n) {
			s.numComputed = 0
			break
		}
		if !e.cfg.DisablePrefixCaching {
			e.stats.PrefixQueries += uint64(total)
			e.stats.PrefixHits += uint64(hitTokens)
		}
		if loaded > 0 {
			// Loaded blocks become most recently used; those read from disk are
			// written back to CPU memory when the GPU caches them (allocate).
			for k := len(hits); k < len(hits)+loaded/e.cfg.BlockSize; k++ {
				h := e.hashOf(s, k)
				if e.cpu == nil || !e.cpu.touch(h) {
					e.disk.touch(h)
				}
			}
			e.stats.CPUHits += uint64(loaded - fromDisk)
			e.stats.DiskHits += uint64(fromDisk)
			r.LoadedTokens += loaded
			r.DiskLoadedTokens += fromDisk
		}
		if !s.scheduled {
			s.cached, s.scheduled = hitTokens+loaded, true
		}
		e.waiting = e.waiting[1:]
		s.state = stateRunning
		e.running = append(e.running, s)
		e.sched = append(e.sched, scheduled{s, n})
		budget -= n
	}
	if len(e.waiting) == 0 {
		e.waiting = nil // drop the consumed backing array
	}

	// Execute: advance computed tokens, sample where a sequence caught up.
	finished := false
	for _, sc := range e.sched {
		s := sc.s
		if s.numComputed >= len(s.req.Prompt) {
			r.DecodeSeqs++
		} else {
			r.PrefillTokens += sc.tokens
		}
		s.numComputed += sc.tokens
		if s.numComputed < s.numTokens() {
			continue // chunked prefill continues next step
		}
		idx := s.numOut
		s.numOut++
		out := Output{ID: s.req.ID, Token: s.req.Output[idx], Index: idx}
		if !s.reported {
			s.reported = true
			out.CachedTokens = s.cached
		}
		if s.numOut == len(s.req.Output) {
			out.Finished = true
			e.finish(s)
			s.state = stateFinished
			finished = true
		}
		r.Outputs = append(r.Outputs, out)
	}
	if finished {
		// Drop finished requests from the batch in one pass, keeping admission order.
		kept := e.running[:0]
		for _, s := range e.running {
			if s.state != stateFinished {
				kept = append(kept, s)
			}
		}
		clear(e.running[len(kept):])
		e.running = kept
	}
	if len(e.sched) > 0 {
		r.Duration = e.cfg.Timing.StepTime(r.PrefillTokens, r.DecodeSeqs) +
			time.Duration(r.LoadedTokens-r.DiskLoadedTokens)*e.cfg.Timing.PerLoadedToken +
			time.Duration(r.DiskLoadedTokens)*e.cfg.Timing.PerDiskLoadedToken
		e.stats.Steps++
	}
	if e.cfg.KVEvents {
		r.Events = e.DrainEvents()
	}
	return r
}

func (e *Engine) preempt(s *sequence) {
	e.pool.release(s.blocks)
	s.blocks = s.blocks[:0]
	s.numComputed, s.numHashed = 0, 0
	s.state = stateWaiting
	e.waiting = append([]*sequence{s}, e.waiting...)
	e.stats.Preemptions++
	e.res.Preempted = append(e.res.Preempted, s.req.ID)
}

// allocate gives s the blocks it needs to hold numComputed+n tokens, taking references
// on hits (cached blocks for its prefix) first, and registers newly full blocks in the
// prefix cache. It changes nothing and returns false when blocks are short.
func (e *Engine) allocate(s *sequence, hits []int32, n int) bool {
	bs := e.cfg.BlockSize
	total := s.numComputed + n
	need := cdiv(total, bs) - len(s.blocks) - len(hits)
	revive := 0
	for _, b := range hits {
		if e.pool.blocks[b].ref == 0 {
			revive++
		}
	}
	if need+revive > e.pool.numFree {
		return false
	}
	for _, b := range hits {
		e.pool.touch(b)
		s.blocks = append(s.blocks, b)
	}
	s.numHashed += len(hits)
	for range max(need, 0) {
		s.blocks = append(s.blocks, e.pool.allocate())
	}
	if e.cfg.DisablePrefixCaching {
		return true
	}
	// Cache blocks that are full once this step's tokens are computed.
	full := min(total, s.numTokens()) / bs
	var ev, cpuEv, diskEv *kvevents.BlockStored
	for k := s.numHashed; k < full; k++ {
		h := e.hashOf(s, k)
		if !e.pool.cache(s.blocks[k], h) {
			ev = e.flushStored(ev)
			cpuEv = e.flushStored(cpuEv)
			diskEv = e.flushStored(diskEv)
			continue
		}
		fresh := true
		if e.cpu != nil {
			cpuEv, fresh = e.writeThrough(e.cpu, kvevents.MediumCPU, s, k, h, cpuEv)
		}
		if e.disk != nil && fresh {
			// Spilled when it enters CPU memory, as oasis-kvcached spills a
			// new value: a block CPU memory still holds is on disk already
			// (or was evicted there as colder than what was spilled since).
			diskEv, _ = e.writeThrough(e.disk, kvevents.MediumDisk, s, k, h, diskEv)
		}
		if e.cfg.KVEvents {
			if ev == nil {
				ev = &kvevents.BlockStored{BlockSize: bs, Medium: kvevents.MediumGPU, LoraName: s.req.LoRA}
				if k > 0 {
					p := kvevents.HashUint64(e.hashOf(s, k-1))
					ev.ParentBlockHash = &p
				}
			}
			ev.BlockHashes = append(ev.BlockHashes, kvevents.HashUint64(h))
			for j := k * bs; j < (k+1)*bs; j++ {
				ev.TokenIDs = append(ev.TokenIDs, s.token(j))
			}
		}
	}
	e.flushStored(ev)
	e.flushStored(cpuEv)
	e.flushStored(diskEv)
	if full > s.numHashed {
		s.numHashed = full
	}
	return true
}

// writeThrough stores block k of s in tier t, extending the pending BlockStored
// event of the tier's medium (or starting one) and reporting any eviction. It
// reports whether the block was new to the tier.
func (e *Engine) writeThrough(t *lruTier, medium string, s *sequence, k int, h uint64, ev *kvevents.BlockStored) (*kvevents.BlockStored, bool) {
	evicted, didEvict, stored := t.store(h)
	if !e.cfg.KVEvents {
		return nil, stored
	}
	if !stored {
		return e.flushStored(ev), false // already there: a later store starts a new run
	}
	if didEvict {
		ev = e.flushStored(ev)
		e.pool.events = appendRemoved(e.pool.events, evicted, medium)
	}
	bs := e.cfg.BlockSize
	if ev == nil {
		ev = &kvevents.BlockStored{BlockSize: bs, Medium: medium, LoraName: s.req.LoRA}
		if k > 0 {
			p := kvevents.HashUint64(e.hashOf(s, k-1))
			ev.ParentBlockHash = &p
		}
	}
	ev.BlockHashes = append(ev.BlockHashes, kvevents.HashUint64(h))
	for j := k * bs; j < (k+1)*bs; j++ {
		ev.TokenIDs = append(ev.TokenIDs, s.token(j))
	}
	return ev, true
}

func (e *Engine) flushStored(ev *kvevents.BlockStored) *kvevents.BlockStored {
	if ev != nil {
		e.pool.events = append(e.pool.events, *ev)
	}
	return nil
}
