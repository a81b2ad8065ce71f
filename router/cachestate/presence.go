package cachestate

import (
	"context"
	"encoding/binary"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// KVCache is a node-local oasis-kvcached instance whose presence events
// (vLLM's KV-event schema, medium CPU for its RAM tier and DISK for its SSD
// tier, no token ids) say which prefix blocks the node holds below the GPUs.
type KVCache struct {
	ID             string
	Address        string // host:port, to resolve a wildcard events host
	Node           string // Nomad node id, joined with Engine.Node
	KVEvents       string // presence events PUB endpoint
	KVEventsReplay string // their replay endpoint, "" if none
}

// DefaultPresenceCapacity bounds how many distinct blocks the router tracks
// as held by kvcached instances. Each costs about 100 bytes here plus one
// index entry (≈60 bytes, see prefixindex's TestBytesPerEntry) per
// event-driven worker, since every worker gets a mark (CPU/disk on the node,
// peer elsewhere): 64k blocks × 64 workers ≈ 250 MiB of index.
const DefaultPresenceCapacity = 1 << 16

// PresenceStats counts what one kvcached's presence events did.
type PresenceStats struct {
	Batches, Stored, Removed int64
	// Unresolved counts announced blocks whose hash maps to no digest: not a
	// 16-byte Oasis digest, and not a block hash any engine or kvcached has
	// reported (an LMCache chunk hash that does not line up with vLLM's block
	// hash, or one whose GPU event has not arrived).
	Unresolved int64
	// Dropped counts blocks not tracked because the presence capacity was full.
	Dropped int64
	// Resyncs counts drops of everything the kvcached held (an event gap its
	// replay buffer could not fill); Replays counts gaps it filled.
	Resyncs, Replays int64
}

// presenceKey folds a presence hash to the key of a kvcached's held map.
func presenceKey(h kvevents.Hash) uint64 { return engineKey(h) }

// heldBlock is one block a kvcached announced: its index key and tiers.
type heldBlock struct {
	key   uint64
	tiers prefixindex.Tier // TierCPU and/or TierDisk
}

// cacheState is the router's view of one kvcached.
type cacheState struct {
	kc     KVCache
	held   map[uint64]heldBlock // presence hash → block
	stats  PresenceStats
	cancel context.CancelFunc
	done   chan struct{}
}

// holder is one kvcached holding a block.
type holder struct {
	cache *cacheState
	tiers prefixindex.Tier
}

// presenceTier maps a presence event's medium to the holder's tier.
func presenceTier(medium string) (prefixindex.Tier, bool) {
	t, ok := TierOfMedium(medium)
	if !ok || t == prefixindex.TierGPU {
		return 0, false // kvcached holds nothing in GPU memory
	}
	return t, true
}

// tiersFor is what a worker on node gets from a block's holders: the
// holders' own tiers when they sit on its node, TierPeer when another node
// holds it (kvcached fetches a missing block from its peers).
func tiersFor(node string, hs []holder) prefixindex.Tier {
	var t prefixindex.Tier
	for _, h := range hs {
		switch {
		case h.tiers == 0:
		case node != "" && h.cache.kc.Node == node:
			t |= h.tiers
		default:
			t |= prefixindex.TierPeer
		}
	}
	return t
}

// candidateEngineKeys lists the engine-hash map keys an LMCache chunk hash
// may have been reported under by an engine: the hash as is (engineKey), and
// for long hashes the forms vLLM's events use — the last 8 bytes as an
// integer (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, the default) and the first 8
// bytes of the full 32-byte hash (bytes events; the key's hex lost leading
// zero bytes).
func candidateEngineKeys(h kvevents.Hash, out []uint64) []uint64 {
	out = append(out[:0], engineKey(h))
	if !h.IsBytes() {
		return out
	}
	b := h.Bytes()
	if len(b) > 8 {
		out = append(out, binary.BigEndian.Uint64(b[len(b)-8:]))
	}
	if len(b) < 32 && len(b) > 8 {
		var full [32]byte
		copy(full[32-len(b):], b)
		out = append(out, binary.BigEndian.Uint64(full[:8]))
	}
	return out
}

// oasisDigestKey reports whether h is an Oasis-native digest (16 bytes:
// keys "oasis@{model}@{digest_hex}") and its index key.
func oasisDigestKey(h kvevents.Hash) (uint64, bool) {
	if !h.IsBytes() {
		return 0, false
	}
	b := h.Bytes()
	if len(b) != blockdigest.Size {
		return 0, false
	}
	var d blockdigest.Digest
	copy(d[:], b)
	return Key(d), true
}

// lookupHash returns the digest an engine block hash maps to.
func (w *EventWorker) lookupHash(k uint64) (blockdigest.Digest, bool) { return w.hashes.Get(k) }

// SyncKVCaches makes the State follow exactly the given kvcached instances:
// new ones get a subscriber, ones whose endpoints changed are resubscribed,
// ones that left lose their subscriber and every mark they caused.
func (s *State) SyncKVCaches(ctx context.Context, caches []KVCache) {
	s.pmu.Lock()
	seen := make(map[string]bool, len(caches))
	var stop []*cacheState
	var start []KVCache
	for _, kc := range caches {
		seen[kc.ID] = true
		if old, ok := s.caches[kc.ID]; ok {
			if old.kc == kc {
				continue
			}
			stop = append(stop, old)
		}
		start = append(start, kc)
	}
	for id, cs := range s.caches {
		if !seen[id] {
			stop = append(stop, cs)
		}
	}
	s.pmu.Unlock()
	for _, cs := range stop {
		s.stopCache(cs)
	}
	for _, kc := range start {
		s.startCache(ctx, kc)
	}
}

func (s *State) startCache(ctx context.Context, kc KVCache) {
	endpoint, err := ResolveEndpoint(kc.KVEvents, kc.Address)
	if err != nil {
		s.log.Warn("kvcached has an unusable presence events endpoint; ignoring it", "kvcached", kc.ID, "error", err)
		return
	}
	replay := ""
	if kc.KVEventsReplay != "" {
		if replay, err = ResolveEndpoint(kc.KVEventsReplay, kc.Address); err != nil {
			s.log.Warn("ignoring unusable kvcached replay endpoint", "kvcached", kc.ID, "error", err)
			replay = ""
		}
	}
	sctx, cancel := context.WithCancel(ctx)
	cs := &cacheState{kc: kc, held: map[uint64]heldBlock{}, cancel: cancel, done: make(chan struct{})}
	s.pmu.Lock()
	s.caches[kc.ID] = cs
	s.pmu.Unlock()
	go s.subscribeCache(sctx, cs, endpoint, replay)
}

// stopCache ends a kvcached's subscriber and withdraws every mark it caused.
func (s *State) stopCache(cs *cacheState) {
	cs.cancel()
	<-cs.done
	s.pmu.Lock()
	defer s.pmu.Unlock()
	s.dropHoldingsLocked(cs)
	if s.caches[cs.kc.ID] == cs {
		delete(s.caches, cs.kc.ID)
	}
}

// KVCacheStats returns the counters of a followed kvcached.
func (s *State) KVCacheStats(id string) (PresenceStats, bool) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	cs, ok := s.caches[id]
	if !ok {
		return PresenceStats{}, false
	}
	return cs.stats, true
}

// KVCaches lists the kvcached instances followed.
func (s *State) KVCaches() []string {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	out := make([]string, 0, len(s.caches))
	for id := range s.caches {
		out = append(out, id)
	}
	return out
}

func (s *State) subscribeCache(ctx context.Context, cs *cacheState, endpoint, replay string) {
	defer close(cs.done)
	log := s.log.With("kvcached", cs.kc.ID, "endpoint", endpoint)
	broken := func(err error) {
		log.Warn("kvcached presence stream failed; dropping its blocks", "error", err)
		s.pmu.Lock()
		cs.stats.Resyncs++
		s.dropHoldingsLocked(cs)
		s.pmu.Unlock()
	}
	followEvents(ctx, log, endpoint, replay, broken, func(rp *replayer, m kvevents.Message) {
		batches, replayed := rp.prepare(m)
		s.applyPresence(cs, batches, replayed)
		rp.applied(batches[len(batches)-1])
	})
}

// applyPresence applies presence batches of one kvcached. Hashes are resolved
// to digests first, without the presence lock (engine hash maps have their
// own locks), then the holdings and index marks change under it.
func (s *State) applyPresence(cs *cacheState, batches []kvevents.Message, replayed bool) {
	resolved := s.resolvePresence(cs, batches)
	now := s.cfg.Now().UnixNano()
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if replayed {
		cs.stats.Replays++
	}
	for _, m := range batches {
		cs.stats.Batches++
		if m.Missed > 0 || m.Restarted {
			cs.stats.Resyncs++
			s.dropHoldingsLocked(cs)
		}
		for _, ev := range m.Batch.Events {
			switch e := ev.(type) {
			case kvevents.BlockStored:
				s.presenceStoredLocked(cs, e.BlockHashes, e.Medium, resolved, now)
			case *kvevents.BlockStored:
				s.presenceStoredLocked(cs, e.BlockHashes, e.Medium, resolved, now)
			case kvevents.BlockRemoved:
				s.presenceRemovedLocked(cs, e.BlockHashes, e.Medium)
			case *kvevents.BlockRemoved:
				s.presenceRemovedLocked(cs, e.BlockHashes, e.Medium)
			case kvevents.AllBlocksCleared, *kvevents.AllBlocksCleared:
				s.dropHoldingsLocked(cs)
			}
		}
	}
}

// resolvePresence maps the stored blocks' hashes to index keys: Oasis
// digests directly; other hashes through what a kvcached already resolved,
// then through the engines' hash maps (engines on the kvcached's node first).
func (s *State) resolvePresence(cs *cacheState, batches []kvevents.Message) map[uint64]uint64 {
	out := map[uint64]uint64{}
	var pending []kvevents.Hash
	s.pmu.Lock()
	for _, m := range batches {
		for _, ev := range m.Batch.Events {
			var hs []kvevents.Hash
			switch e := ev.(type) {
			case kvevents.BlockStored:
				hs = e.BlockHashes
			case *kvevents.BlockStored:
				hs = e.BlockHashes
			}
			for _, h := range hs {
				pk := presenceKey(h)
				if _, done := out[pk]; done {
					continue
				}
				if k, ok := oasisDigestKey(h); ok {
					out[pk] = k
					continue
				}
				if k, ok := s.heldKeyLocked(pk); ok {
					out[pk] = k
					continue
				}
				pending = append(pending, h)
			}
		}
	}
	s.pmu.Unlock()
	if len(pending) == 0 {
		return out
	}
	s.mu.Lock()
	engines := make([]*engineState, 0, len(s.engines))
	for _, es := range s.engines {
		if es.ew == nil {
			continue
		}
		if es.eng.Node == cs.kc.Node {
			engines = append([]*engineState{es}, engines...)
		} else {
			engines = append(engines, es)
		}
	}
	s.mu.Unlock()
	var cands []uint64
	for _, h := range pending {
		pk := presenceKey(h)
		if _, done := out[pk]; done {
			continue
		}
		cands = candidateEngineKeys(h, cands)
	search:
		for _, es := range engines {
			es.mu.Lock()
			for _, c := range cands {
				if d, ok := es.ew.lookupHash(c); ok {
					out[pk] = Key(d)
					es.mu.Unlock()
					break search
				}
			}
			es.mu.Unlock()
		}
	}
	return out
}

// heldKeyLocked finds a presence hash some kvcached already resolved.
func (s *State) heldKeyLocked(pk uint64) (uint64, bool) {
	for _, c := range s.caches {
		if b, ok := c.held[pk]; ok {
			return b.key, true
		}
	}
	return 0, false
}

func (s *State) presenceStoredLocked(cs *cacheState, hashes []kvevents.Hash, medium string, resolved map[uint64]uint64, now int64) {
	tier, ok := presenceTier(medium)
	if !ok {
		return
	}
	for _, h := range hashes {
		pk := presenceKey(h)
		b, known := cs.held[pk]
		if !known {
			k, ok := resolved[pk]
			if !ok {
				cs.stats.Unresolved++
				continue
			}
			if _, tracked := s.holders[k]; !tracked && len(s.holders) >= s.presenceCap {
				cs.stats.Dropped++
				continue
			}
			b = heldBlock{key: k}
		}
		if b.tiers&tier != 0 {
			continue
		}
		b.tiers |= tier
		cs.held[pk] = b
		cs.stats.Stored++
		s.setHolderLocked(cs, b.key, b.tiers, now)
	}
}

func (s *State) presenceRemovedLocked(cs *cacheState, hashes []kvevents.Hash, medium string) {
	tier, ok := presenceTier(medium)
	if !ok {
		return
	}
	for _, h := range hashes {
		pk := presenceKey(h)
		b, known := cs.held[pk]
		if !known || b.tiers&tier == 0 {
			continue
		}
		b.tiers &^= tier
		if b.tiers == 0 {
			delete(cs.held, pk)
		} else {
			cs.held[pk] = b
		}
		cs.stats.Removed++
		s.setHolderLocked(cs, b.key, b.tiers, 0)
	}
}

// dropHoldingsLocked withdraws everything cs announced.
func (s *State) dropHoldingsLocked(cs *cacheState) {
	for pk, b := range cs.held {
		s.setHolderLocked(cs, b.key, 0, 0)
		delete(cs.held, pk)
	}
}

// setHolderLocked sets the tiers in which cs holds key k (0: not at all) and
// changes every event-driven worker's marks by the difference it makes.
func (s *State) setHolderLocked(cs *cacheState, k uint64, tiers prefixindex.Tier, now int64) {
	before := s.holders[k]
	after := make([]holder, 0, len(before)+1)
	for _, h := range before {
		if h.cache != cs {
			after = append(after, h)
		}
	}
	if tiers != 0 {
		after = append(after, holder{cache: cs, tiers: tiers})
	}
	if len(after) == 0 {
		delete(s.holders, k)
	} else {
		s.holders[k] = after
	}
	key := []uint64{k}
	for id, node := range s.presenceWorkers {
		was, is := tiersFor(node, before), tiersFor(node, after)
		s.markLocked(id, k, key, was, is, now)
	}
}

// markLocked moves worker id's marks of key k from tiers was to tiers is.
func (s *State) markLocked(id string, k uint64, key []uint64, was, is prefixindex.Tier, now int64) {
	if gone := was &^ is; gone != 0 {
		if err := s.events.Remove(id, gone, key, nil); err != nil {
			s.log.Debug("withdrawing kvcached mark", "engine", id, "error", err)
		}
	}
	for t := prefixindex.TierCPU; t <= prefixindex.TierPeer; t <<= 1 {
		if (is&^was)&t == 0 {
			continue
		}
		if err := s.events.Store(id, t, key, now); err != nil {
			s.log.Debug("recording kvcached mark", "engine", id, "error", err)
		}
	}
}

// syncPresenceWorkersLocked records the event-driven workers and their nodes
// (called by Sync with s.mu held; lock order s.mu → s.pmu). Workers new to
// the set get the marks of every block kvcached instances hold now.
func (s *State) syncPresenceWorkersLocked(workers map[string]string) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	var added []string
	for id, node := range workers {
		if old, ok := s.presenceWorkers[id]; !ok || old != node {
			added = append(added, id)
		}
	}
	s.presenceWorkers = workers
	if len(s.holders) == 0 {
		return
	}
	for _, id := range added {
		s.restoreMarksLocked(id)
	}
}

// restorePresenceMarks re-marks what kvcached instances hold for worker id,
// after its own events cleared its entries (resync, AllBlocksCleared).
func (s *State) restorePresenceMarks(id string) {
	s.pmu.Lock()
	defer s.pmu.Unlock()
	if _, ok := s.presenceWorkers[id]; ok {
		s.restoreMarksLocked(id)
	}
}

func (s *State) restoreMarksLocked(id string) {
	node := s.presenceWorkers[id]
	now := s.cfg.Now().UnixNano()
	key := make([]uint64, 1)
	for k, hs := range s.holders {
		key[0] = k
		s.markLocked(id, k, key, 0, tiersFor(node, hs), now)
	}
}
