package cachestate

import (
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/prefixindex"
)

// In-flight decisions. An engine that publishes KV events publishes a block
// only once it has computed it: the index learns a prompt one queue and one
// prefill after the router sent it there. Requests that follow a new prefix
// within that time (a burst of one tenant, the next turn of a tool loop) would
// see nobody holding it and spread, each recomputing it. So the router also
// records its own decisions to event-driven engines, in a third index whose
// entries live InflightTTL: long enough for the engine's events to arrive,
// short enough that an entry the engine never confirms (it evicted or never
// computed the blocks) is soon forgotten. Match takes, per engine, the longer
// of what its events say and what the router sent it.

// Defaults of the in-flight record's bounds.
const (
	// DefaultInflightTTL covers a prompt's queue and prefill on a loaded
	// engine (the SLO's TTFT is 2 s).
	DefaultInflightTTL = 10 * time.Second
	// DefaultInflightWorkerBlocks bounds one engine's in-flight entries
	// (1M tokens of 16-token blocks): its LRU evicts the oldest past it.
	DefaultInflightWorkerBlocks = 1 << 16
	// DefaultInflightMaxBlocks bounds all engines' in-flight entries
	// together (about 60 MiB).
	DefaultInflightMaxBlocks = 1 << 20
)

// NewInflightIndex returns an index for in-flight decisions: entries expire
// after ttl, each worker added with capacity 0 keeps at most workerBlocks,
// and all workers together at most maxBlocks (past it the least recently
// stored entry of any worker goes). onEvict, when set, counts those.
func NewInflightIndex(ttl time.Duration, workerBlocks, maxBlocks int, onEvict func(int)) *prefixindex.Index {
	return prefixindex.New(prefixindex.Config{DefaultCapacity: workerBlocks, TTL: int64(ttl), MaxEntries: maxBlocks,
		OnBudgetEvict: onEvict})
}

// InflightMatcher folds an in-flight index's matches into those of the
// indexes of what engines hold. Its methods are safe for concurrent use.
type InflightMatcher struct {
	pool sync.Pool // *map[string]int: worker → position in out
}

// Match appends inflight's matches of keys to out, except that a worker
// already in out[start:] keeps one entry: the longer match of the two (by
// tier-weighted blocks, then blocks). A match that the in-flight record
// lengthens (or adds) counts its blocks past the confirmed match in
// Inflight, so a term can tell a copy the engine has computed from one the
// router only sent. A nil inflight leaves out as it is.
func (m *InflightMatcher) Match(inflight *prefixindex.Index, keys []uint64, w prefixindex.TierWeights,
	out []prefixindex.Match, start int) []prefixindex.Match {
	if inflight == nil {
		return out
	}
	held := len(out)
	out = inflight.Match(keys, w, out)
	for i := held; i < len(out); i++ {
		out[i].Inflight = out[i].Blocks
	}
	if held == start || len(out) == held {
		return out
	}
	seen, _ := m.pool.Get().(*map[string]int)
	if seen == nil {
		mp := make(map[string]int)
		seen = &mp
	}
	defer m.pool.Put(seen)
	clear(*seen)
	for i := start; i < held; i++ {
		(*seen)[out[i].Worker] = i
	}
	n := held
	for _, f := range out[held:] {
		i, ok := (*seen)[f.Worker]
		if !ok {
			out[n] = f
			n++
			continue
		}
		if longer(f, out[i]) {
			f.Inflight = max(0, f.Blocks-out[i].Blocks)
			out[i] = f
		}
	}
	return out[:n]
}

// longer reports whether match a is worth more than b.
func longer(a, b prefixindex.Match) bool {
	if a.Weighted != b.Weighted {
		return a.Weighted > b.Weighted
	}
	return a.Blocks > b.Blocks
}
