// Package cluster is a discrete-event simulator of an Oasis-routed inference
// cluster under a virtual clock. It reuses the router's real code — the
// scoring Selector and terms (router/scoring, including the prefix term and
// its hot-spot guard), the prefix index (router/prefixindex) and the
// KV-event learner (router/cachestate.EventWorker, which recomputes BLAKE3
// block digests from event token ids) — and oasis-sim's engine model
// (sim/engine: V1 scheduler, chunked prefill, prefix cache with LRU eviction,
// KV events, step-time model) for every worker.
package cluster

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
)

// TraceBlock is the Mooncake trace's block size: each hash id stands for 512
// tokens.
const TraceBlock = 512

// Request is one trace request.
type Request struct {
	// Arrival is the arrival time in ms from the start, before rate scaling.
	Arrival int64 `json:"timestamp"`
	Input   int   `json:"input_length"`
	Output  int   `json:"output_length"`
	// HashIDs are prefix block ids, TraceBlock tokens each; equal ids at the
	// same position mean a reusable prefix. The last block may be partial.
	HashIDs []int64 `json:"hash_ids"`

	keys []uint64 // router block keys, computed once (see Sim.keysOf)
}

// LoadTrace reads a trace in the Mooncake JSONL format, gunzipped when the
// name ends in .gz.
func LoadTrace(path string) ([]*Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("opening trace: %w", err)
	}
	defer f.Close()
	if !strings.HasSuffix(path, ".gz") {
		return ReadTrace(f)
	}
	z, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("trace %s: %w", path, err)
	}
	defer z.Close()
	return ReadTrace(z)
}

// ReadTrace parses Mooncake JSONL: one request per line, sorted by arrival.
func ReadTrace(r io.Reader) ([]*Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []*Request
	for line := 1; sc.Scan(); line++ {
		if len(sc.Bytes()) == 0 {
			continue
		}
		req := &Request{}
		if err := json.Unmarshal(sc.Bytes(), req); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		switch {
		case req.Input <= 0:
			return nil, fmt.Errorf("trace line %d: input_length %d must be positive", line, req.Input)
		case req.Output <= 0:
			return nil, fmt.Errorf("trace line %d: output_length %d must be positive", line, req.Output)
		case len(req.HashIDs)*TraceBlock < req.Input:
			return nil, fmt.Errorf("trace line %d: %d hash ids cover %d tokens, input_length is %d", line, len(req.HashIDs), len(req.HashIDs)*TraceBlock, req.Input)
		}
		out = append(out, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading trace: %w", err)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	return out, nil
}

// mix is splitmix64's finalizer.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// vocab bounds generated token ids (a Llama-3-sized vocabulary).
const vocab = 128000

// PromptTokens expands a request into token ids: token j of hash id h is
// f(h, j), so requests sharing hash ids share exactly those tokens and the
// prefix structure is exact at any engine block size.
func (r *Request) PromptTokens(dst []int32) []int32 {
	dst = dst[:0]
	for k, h := range r.HashIDs {
		for j := 0; j < TraceBlock && k*TraceBlock+j < r.Input; j++ {
			dst = append(dst, int32(mix(uint64(h)<<10|uint64(j))%vocab))
		}
	}
	return dst
}

// outputTokens are the tokens request i generates (never reused by a prompt).
func outputTokens(i, n int) []int32 {
	out := make([]int32, n)
	for j := range out {
		out[j] = int32(mix(uint64(i)<<32|uint64(j)|1<<62) % vocab)
	}
	return out
}

// OracleHitRatio is the fraction of prompt tokens an infinite shared cache
// would serve, at the engine's block size and with the engine's rule that
// the last prompt token is always computed.
func OracleHitRatio(reqs []*Request, blockSize int) float64 {
	hit, total := oracleHits(reqs, blockSize)
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// oracleHits returns the prompt tokens an infinite shared cache would serve
// (OracleHitRatio) and all the trace's prompt tokens.
func oracleHits(reqs []*Request, blockSize int) (hit, total int64) {
	// seen[h] is how many tokens of hash id h some earlier request computed.
	seen := make(map[int64]int, len(reqs)*8)
	for _, r := range reqs {
		total += int64(r.Input)
		maxTok := (r.Input - 1) / blockSize * blockSize
		got := 0
		for k, h := range r.HashIDs {
			need := min(TraceBlock, r.Input-k*TraceBlock)
			have := seen[h]
			got += min(have, need)
			if have < need {
				break
			}
		}
		got = min(got/blockSize*blockSize, maxTok)
		hit += int64(got)
		for k, h := range r.HashIDs {
			n := min(TraceBlock, r.Input-k*TraceBlock)
			if n > seen[h] {
				seen[h] = n
			}
		}
	}
	return hit, total
}

// SyntheticConfig shapes a shared-prefix workload.
type SyntheticConfig struct {
	Groups         int     // prefix groups (e.g. tenants or apps), each with its own system prompt
	PromptsPerGrp  int     // conversations per group
	SystemBlocks   int     // system prompt length in trace blocks (512 tokens)
	UserBlocks     int     // new blocks per turn
	Turns          int     // turns per conversation
	Zipf           float64 // popularity skew of groups (s > 1; 0 = uniform)
	Rate           float64 // conversation starts per second
	ThinkSeconds   float64 // mean gap between a conversation's turns
	OutputTokens   int
	SharedSysBlock bool // every request also starts with one global block (as Mooncake's)
	Seed           uint64
}

// Synthetic generates a shared-prefix, multi-turn workload in the trace format.
func Synthetic(c SyntheticConfig) []*Request {
	rng := rand.New(rand.NewPCG(c.Seed, 0x5eed))
	var zipf *rand.Zipf
	if c.Zipf > 1 && c.Groups > 1 {
		zipf = rand.NewZipf(rng, c.Zipf, 1, uint64(c.Groups-1))
	}
	next := int64(1)
	newID := func() int64 { next++; return next }
	sys := make([][]int64, c.Groups)
	for g := range sys {
		for b := 0; b < c.SystemBlocks; b++ {
			sys[g] = append(sys[g], newID())
		}
	}
	var out []*Request
	t := 0.0
	for conv := 0; conv < c.Groups*c.PromptsPerGrp; conv++ {
		t += rng.ExpFloat64() / c.Rate
		g := rng.IntN(c.Groups)
		if zipf != nil {
			g = int(zipf.Uint64())
		}
		var ids []int64
		if c.SharedSysBlock {
			ids = append(ids, 1)
		}
		ids = append(ids, sys[g]...)
		at := t
		for turn := 0; turn < c.Turns; turn++ {
			for b := 0; b < c.UserBlocks; b++ {
				ids = append(ids, newID())
			}
			out = append(out, &Request{
				Arrival: int64(at * 1000),
				Input:   len(ids) * TraceBlock,
				Output:  c.OutputTokens,
				HashIDs: append([]int64(nil), ids...),
			})
			// The answer becomes part of the next turn's prompt.
			for b := 0; b < max(1, c.OutputTokens/TraceBlock); b++ {
				ids = append(ids, newID())
			}
			at += rng.ExpFloat64() * c.ThinkSeconds
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Arrival < out[j].Arrival })
	return out
}

// Span is the trace's duration in seconds (first to last arrival).
func Span(reqs []*Request) float64 {
	if len(reqs) < 2 {
		return 0
	}
	return float64(reqs[len(reqs)-1].Arrival-reqs[0].Arrival) / 1000
}

func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
