package cachestate

import (
	"encoding/binary"
	"fmt"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/u64map"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// engineKey folds an engine block hash (uint64, or 32-byte sha256) to 64 bits
// for the engine-hash → digest map.
func engineKey(h kvevents.Hash) uint64 {
	if v, ok := h.Uint64(); ok {
		return v
	}
	b := h.Bytes()
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[:8])
	}
	var pad [8]byte
	copy(pad[8-len(b):], b)
	return binary.BigEndian.Uint64(pad[:])
}

// EventWorker turns one engine's KV events into prefix index updates. It
// recomputes Oasis digests from each BlockStored event's token ids and its
// parent (so the router never depends on the engine's hash function), and
// keeps the engine-hash → digest map that BlockRemoved and the next
// BlockStored's parent need. It is not safe for concurrent use: one goroutine
// (the engine's subscriber) feeds it.
type EventWorker struct {
	id     string
	model  string
	index  *prefixindex.Index
	dig    *Digester
	hashes *u64map.Map[blockdigest.Digest] // engine hash → Oasis digest (Root, all zero, is no digest of a real block)

	hasher    *blockdigest.Hasher // for hasherDom and the last event's block size
	hasherDom blockdigest.Domain

	// own is every tier the engine's own events have stored into. Only those
	// tiers keep an engine hash mapped after a BlockRemoved: the index may
	// also hold the block for this worker in tiers kvcached's presence marks
	// (presence.go), which the engine never removes, so counting them would
	// keep the mapping forever.
	own prefixindex.Tier

	// reusable buffers
	keys  []uint64
	ek    []uint64
	left  []prefixindex.Tier
	block []uint32

	stats EventStats
}

// EventStats counts what an EventWorker did.
type EventStats struct {
	Batches, BlocksStored, BlocksRemoved, Clears int64
	// Resyncs counts drops of the worker's whole state after a sequence gap or
	// a publisher restart.
	Resyncs int64
	// Orphans counts stored blocks whose parent the router does not know (it
	// subscribed, or resynchronised, after the parent was stored): their
	// prefix cannot be digested, so they are not indexed.
	Orphans int64
	// Malformed counts events rejected as inconsistent (token count, block size).
	Malformed int64
	// Replays counts sequence gaps filled from the engine's replay buffer
	// (no resync needed).
	Replays int64
}

// ReplayFunc fetches an engine's buffered batches with seq ≥ from, in order
// (kvevents.Replay against the engine's replay endpoint).
type ReplayFunc func(from int64) ([]kvevents.Message, error)

// ApplyOrReplay applies m like Apply, but first tries to fill a sequence gap
// from the engine's replay buffer: when fetch returns every missed batch, they
// are applied in order and the worker's state is kept; otherwise (no replay
// endpoint, buffer overrun, error) the gap resynchronises as in Apply.
func (w *EventWorker) ApplyOrReplay(m kvevents.Message, now int64, fetch ReplayFunc) error {
	if m.Missed > 0 && !m.Restarted && fetch != nil {
		from := m.Seq - m.Missed
		got, err := fetch(from)
		if err == nil {
			var fill []kvevents.Message
			next := from
			for _, g := range got {
				if g.Seq == next && next < m.Seq {
					fill = append(fill, g)
					next++
				}
			}
			if next == m.Seq {
				for _, g := range fill {
					g.Missed, g.Restarted = 0, false
					if err := w.Apply(g, now); err != nil {
						return err
					}
				}
				w.stats.Replays++
				m.Missed = 0
			}
		}
	}
	return w.Apply(m, now)
}

// NewEventWorker returns the event state of worker id serving model. The
// worker must be registered in index.
func NewEventWorker(id, model string, index *prefixindex.Index, dig *Digester) *EventWorker {
	return &EventWorker{id: id, model: model, index: index, dig: dig, hashes: u64map.New[blockdigest.Digest]()}
}

// Stats returns the counters so far.
func (w *EventWorker) Stats() EventStats { return w.stats }

// Resync drops everything known about the worker: its index entries and the
// engine-hash map. What the engine still caches reappears as it is stored again.
func (w *EventWorker) Resync() error {
	w.stats.Resyncs++
	return w.clear()
}

func (w *EventWorker) clear() error {
	w.hashes.Reset() // start small again
	if _, err := w.index.ClearWorker(w.id); err != nil {
		return fmt.Errorf("clearing worker %s: %w", w.id, err)
	}
	return nil
}

// Apply applies one received batch at time now (ns, for the index's LRU
// stamps). A gap in sequence numbers or a publisher restart first drops the
// worker's state: a stale entry would route requests to a cache that is gone.
func (w *EventWorker) Apply(m kvevents.Message, now int64) error {
	w.stats.Batches++
	if m.Missed > 0 || m.Restarted {
		if err := w.Resync(); err != nil {
			return err
		}
	}
	for _, ev := range m.Batch.Events {
		var err error
		switch e := ev.(type) {
		case kvevents.BlockStored:
			err = w.stored(&e, now)
		case *kvevents.BlockStored:
			err = w.stored(e, now)
		case kvevents.BlockRemoved:
			err = w.removed(&e)
		case *kvevents.BlockRemoved:
			err = w.removed(e)
		case kvevents.AllBlocksCleared, *kvevents.AllBlocksCleared:
			w.stats.Clears++
			err = w.clear()
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func (w *EventWorker) stored(e *kvevents.BlockStored, now int64) error {
	tier, ok := TierOfMedium(e.Medium)
	if !ok || e.BlockSize <= 0 || len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize {
		w.stats.Malformed++
		return nil
	}
	parent := blockdigest.Root
	if e.ParentBlockHash != nil {
		p, known := w.hashes.Get(engineKey(*e.ParentBlockHash))
		if !known {
			w.stats.Orphans += int64(len(e.BlockHashes))
			return nil
		}
		parent = p
	}
	h, err := w.hasherFor(blockdigest.Domain{Model: w.model, LoRA: e.LoraName}, e.BlockSize)
	if err != nil {
		return fmt.Errorf("digesting blocks of %s: %w", w.id, err)
	}
	// The engine hashes' map entries are loaded ahead, so their misses overlap.
	ek := w.ek[:0]
	for _, bh := range e.BlockHashes {
		ek = append(ek, engineKey(bh))
	}
	w.ek = ek
	w.hashes.Warm(ek)
	if cap(w.block) < e.BlockSize {
		w.block = make([]uint32, e.BlockSize)
	}
	block := w.block[:e.BlockSize]
	keys := w.keys[:0]
	for i, k := range ek {
		// A block the engine already stored in another tier (its CPU or disk
		// copy of a GPU block) has its digest mapped: the engine hash covers
		// the parent and the tokens, so the digest is the same.
		if d, known := w.hashes.Get(k); known {
			keys = append(keys, Key(d))
			parent = d
			continue
		}
		for j, t := range e.TokenIDs[i*e.BlockSize : (i+1)*e.BlockSize] {
			block[j] = uint32(t)
		}
		d, err := h.Extend(parent, block)
		if err != nil {
			return fmt.Errorf("digesting blocks of %s: %w", w.id, err)
		}
		w.hashes.Put(k, d)
		keys = append(keys, Key(d))
		parent = d
	}
	w.keys = keys
	w.own |= tier
	w.stats.BlocksStored += int64(len(keys))
	return w.index.Store(w.id, tier, keys, now)
}

func (w *EventWorker) removed(e *kvevents.BlockRemoved) error {
	tier, ok := TierOfMedium(e.Medium)
	if !ok {
		w.stats.Malformed++
		return nil
	}
	all := w.ek[:0]
	for _, bh := range e.BlockHashes {
		all = append(all, engineKey(bh))
	}
	w.hashes.Warm(all)
	// Known hashes are compacted to the front of the same buffer.
	keys, ek := w.keys[:0], all[:0]
	for _, k := range all {
		d, known := w.hashes.Get(k)
		if !known {
			continue
		}
		keys = append(keys, Key(d))
		ek = append(ek, k)
	}
	w.keys, w.ek = keys, all
	if cap(w.left) < len(keys) {
		w.left = make([]prefixindex.Tier, len(keys))
	}
	left := w.left[:len(keys)]
	if err := w.index.Remove(w.id, tier, keys, left); err != nil {
		return err
	}
	for i, k := range ek {
		if left[i]&w.own == 0 {
			w.hashes.Delete(k)
		}
	}
	w.stats.BlocksRemoved += int64(len(keys))
	return nil
}

// hasherFor returns the worker's hasher for a domain and block size. The
// worker keeps the last one: an engine's events nearly always share both, and
// taking one from the Digester's pool per event costs a lock and a map lookup.
func (w *EventWorker) hasherFor(dom blockdigest.Domain, blockSize int) (*blockdigest.Hasher, error) {
	if w.hasher != nil && w.hasherDom == dom && w.hasher.BlockSize() == blockSize {
		return w.hasher, nil
	}
	h, err := w.dig.Hasher(dom, blockSize)
	if err != nil {
		return nil, err
	}
	if w.hasher != nil {
		w.dig.Release(w.hasherDom, w.hasher)
	}
	w.hasher, w.hasherDom = h, dom
	return h, nil
}

// KnownHashes returns how many engine block hashes the worker maps.
func (w *EventWorker) KnownHashes() int { return w.hashes.Len() }
