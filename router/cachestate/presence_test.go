package cachestate

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/shoenig/test/must"
)

func TestOasisDigestKey(t *testing.T) {
	d := blockdigest.FromUint64s(0x0102030405060708, 0x1112131415161718)
	k, ok := oasisDigestKey(kvevents.HashBytes(d[:]))
	must.True(t, ok)
	must.Eq(t, Key(d), k)
	_, ok = oasisDigestKey(kvevents.HashUint64(7))
	must.False(t, ok)
	_, ok = oasisDigestKey(kvevents.HashBytes(make([]byte, 32)))
	must.False(t, ok, must.Sprint("only 16-byte hashes are Oasis digests"))
}

// An LMCache chunk hash is the full sha256 of vLLM's block hash input; vLLM's
// events carry its last 8 bytes as an integer (or the 32 bytes themselves).
func TestCandidateEngineKeys(t *testing.T) {
	full := make([]byte, 32)
	for i := range full {
		full[i] = byte(i + 1)
	}
	last := binary.BigEndian.Uint64(full[24:])
	first := binary.BigEndian.Uint64(full[:8])
	must.SliceContains(t, candidateEngineKeys(kvevents.HashBytes(full), nil), last)
	must.SliceContains(t, candidateEngineKeys(kvevents.HashBytes(full), nil), first)
	// A hash whose hex lost a leading zero byte still finds the 32-byte form.
	full[0] = 0
	trimmed := full[1:]
	got := candidateEngineKeys(kvevents.HashBytes(trimmed), nil)
	must.SliceContains(t, got, binary.BigEndian.Uint64(full[:8]))
	must.SliceContains(t, got, last)
	must.Eq(t, []uint64{42}, candidateEngineKeys(kvevents.HashUint64(42), nil))
}

func TestTiersFor(t *testing.T) {
	a := &cacheState{kc: KVCache{ID: "kc-a", Node: "A"}}
	b := &cacheState{kc: KVCache{ID: "kc-b", Node: "B"}}
	hs := []holder{{cache: a, tiers: prefixindex.TierCPU}, {cache: b, tiers: prefixindex.TierDisk}}
	must.Eq(t, prefixindex.TierCPU|prefixindex.TierPeer, tiersFor("A", hs))
	must.Eq(t, prefixindex.TierDisk|prefixindex.TierPeer, tiersFor("B", hs))
	must.Eq(t, prefixindex.TierPeer, tiersFor("C", hs))
	must.Eq(t, prefixindex.TierCPU, tiersFor("A", hs[:1]))
	must.Eq(t, prefixindex.Tier(0), tiersFor("A", nil))
}

// newPub binds a publisher on a kernel-chosen loopback port.
func newPub(t *testing.T, ctx context.Context, replay bool) *kvevents.Publisher {
	t.Helper()
	cfg := kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"}
	if replay {
		cfg.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	p, err := kvevents.NewPublisher(cfg)
	must.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	go p.Run(ctx)
	return p
}

func endpointOf(a net.Addr) string { return fmt.Sprintf("tcp://*:%d", a.(*net.TCPAddr).Port) }

func presenceStored(medium string, hs ...kvevents.Hash) kvevents.EventBatch {
	return kvevents.EventBatch{TS: float64(time.Now().UnixNano()), Events: []kvevents.Event{
		kvevents.BlockStored{BlockHashes: hs, BlockSize: bs, TokenIDs: []int32{}, Medium: medium}}}
}

func presenceRemoved(medium string, hs ...kvevents.Hash) kvevents.EventBatch {
	return kvevents.EventBatch{TS: float64(time.Now().UnixNano()), Events: []kvevents.Event{
		kvevents.BlockRemoved{BlockHashes: hs, Medium: medium}}}
}

// Presence events of kvcached instances over real ZMQ sockets: Oasis digests
// map directly, engine hashes through the engines' own events; a kvcached's
// node decides CPU/disk (same node) or peer (other nodes); removals, a
// second holder, an engine resync and the kvcached leaving all move the marks.
func TestPresenceOverZMQ(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	engA, engB := newPub(t, ctx, false), newPub(t, ctx, false)
	kcA, kcB := newPub(t, ctx, true), newPub(t, ctx, false)

	s := New(Config{})
	defer s.Close()
	s.Sync(ctx, []Engine{
		{ID: "a1", Model: "model-a", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: endpointOf(engA.Addr()), Node: "A"},
		{ID: "b1", Model: "model-a", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: endpointOf(engB.Addr()), Node: "B"},
	})
	s.SyncKVCaches(ctx, []KVCache{
		{ID: "kc-a", Address: "127.0.0.1:6380", Node: "A", KVEvents: endpointOf(kcA.Addr()), KVEventsReplay: endpointOf(kcA.ReplayAddr())},
		{ID: "kc-b", Address: "127.0.0.1:6380", Node: "B", KVEvents: endpointOf(kcB.Addr())},
	})
	ix := s.EventIndex()
	holds := func(w string, k uint64) prefixindex.Tier { return ix.Holds(w, k) }

	// 1. Oasis-native key: a 16-byte digest, indexed as is.
	d := blockdigest.FromUint64s(0xA1A2A3A4A5A6A7A8, 0xB1B2B3B4B5B6B7B8)
	dk := Key(d)
	publishUntil(t, kcA, presenceStored("CPU", kvevents.HashBytes(d[:])), "native digest in kc-a",
		func() bool { return holds("a1", dk) == prefixindex.TierCPU && holds("b1", dk) == prefixindex.TierPeer })
	// Spilled to SSD and dropped from RAM.
	publishUntil(t, kcA, presenceStored("DISK", kvevents.HashBytes(d[:])), "spill",
		func() bool { return holds("a1", dk) == prefixindex.TierCPU|prefixindex.TierDisk })
	publishUntil(t, kcA, presenceRemoved("CPU", kvevents.HashBytes(d[:])), "RAM eviction",
		func() bool { return holds("a1", dk) == prefixindex.TierDisk && holds("b1", dk) == prefixindex.TierPeer })

	// 2. Engine hash: a1 stores a block (GPU) under vLLM hash 0xABC; kvcached B
	// announces the LMCache chunk hash whose last 8 bytes are that hash.
	seq := toks(1, bs)
	ek := keys(t, "model-a", seq)[0]
	publishUntil(t, engA, kvevents.EventBatch{TS: 1, Events: []kvevents.Event{stored(nil, []kvevents.Hash{h(0xABC)}, seq, "")}},
		"a1's GPU block", func() bool { return holds("a1", ek) == prefixindex.TierGPU })
	chunk := make([]byte, 32)
	chunk[0] = 0x7f
	binary.BigEndian.PutUint64(chunk[24:], 0xABC)
	publishUntil(t, kcB, presenceStored("CPU", kvevents.HashBytes(chunk)), "chunk hash in kc-b",
		func() bool { return holds("b1", ek) == prefixindex.TierCPU })
	must.Eq(t, prefixindex.TierGPU|prefixindex.TierPeer, holds("a1", ek))
	// a1 evicts it from GPU: the lower tiers remain.
	publishUntil(t, engA, kvevents.EventBatch{TS: 2, Events: []kvevents.Event{kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{h(0xABC)}}}},
		"a1's GPU eviction", func() bool { return holds("a1", ek) == prefixindex.TierPeer })
	// kvcached A fetches it from B later (a peer fetch stores it locally): it
	// resolves through kc-b's holding although no engine maps it any more.
	publishUntil(t, kcA, presenceStored("CPU", kvevents.HashBytes(chunk)), "peer-fetched chunk in kc-a",
		func() bool { return holds("a1", ek) == prefixindex.TierCPU|prefixindex.TierPeer })
	// B drops it: a1 keeps CPU (kc-a), b1 now sees it on a peer.
	publishUntil(t, kcB, presenceRemoved("CPU", kvevents.HashBytes(chunk)), "kc-b removal",
		func() bool { return holds("a1", ek) == prefixindex.TierCPU && holds("b1", ek) == prefixindex.TierPeer })

	// 3. A hash nobody reported stays unindexed and is counted.
	publishUntil(t, kcB, presenceStored("CPU", kvevents.HashUint64(0xDEAD)), "unresolved count",
		func() bool { st, _ := s.KVCacheStats("kc-b"); return st.Unresolved > 0 })

	// 4. An engine resync keeps what kvcached holds reachable for it.
	publishUntil(t, engA, kvevents.EventBatch{TS: 3, Events: []kvevents.Event{kvevents.AllBlocksCleared{}}},
		"a1 cleared", func() bool { st, _ := s.EngineStats("a1"); return st.Clears > 0 })
	testutil.Eventually(t, 10*time.Second, "marks restored after the clear", func() bool {
		return holds("a1", ek) == prefixindex.TierCPU && holds("a1", dk) == prefixindex.TierDisk
	})

	// 5. A new engine on node B learns what is held already.
	engB2 := newPub(t, ctx, false)
	s.Sync(ctx, []Engine{
		{ID: "a1", Model: "model-a", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: endpointOf(engA.Addr()), Node: "A"},
		{ID: "b1", Model: "model-a", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: endpointOf(engB.Addr()), Node: "B"},
		{ID: "b2", Model: "model-a", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: endpointOf(engB2.Addr()), Node: "B"},
	})
	must.Eq(t, prefixindex.TierPeer, holds("b2", dk))
	must.Eq(t, prefixindex.TierPeer, holds("b2", ek))

	// 6. kvcached A leaves: every mark it caused goes.
	s.SyncKVCaches(ctx, []KVCache{{ID: "kc-b", Address: "127.0.0.1:6380", Node: "B", KVEvents: endpointOf(kcB.Addr())}})
	for _, w := range []string{"a1", "b1", "b2"} {
		must.Eq(t, prefixindex.Tier(0), holds(w, dk), must.Sprintf("%s still marked for the native digest", w))
		must.Eq(t, prefixindex.Tier(0), holds(w, ek), must.Sprintf("%s still marked for the chunk", w))
	}
	must.Eq(t, []string{"kc-b"}, s.KVCaches())
}

// A router that subscribes after kvcached stored blocks learns them from the
// replay buffer; the capacity bounds what is tracked.
func TestPresenceBootstrapAndCapacity(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	eng, kc := newPub(t, ctx, false), newPub(t, ctx, true)
	var ds []blockdigest.Digest
	for i := range 4 {
		d := blockdigest.FromUint64s(uint64(i+1)<<32, uint64(i))
		ds = append(ds, d)
		_, err := kc.Publish(presenceStored("CPU", kvevents.HashBytes(d[:])))
		must.NoError(t, err)
	}
	s := New(Config{PresenceCapacity: 3})
	defer s.Close()
	s.Sync(ctx, []Engine{{ID: "a1", Model: "m", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: endpointOf(eng.Addr()), Node: "A"}})
	s.SyncKVCaches(ctx, []KVCache{{ID: "kc", Address: "127.0.0.1:1", Node: "A", KVEvents: endpointOf(kc.Addr()), KVEventsReplay: endpointOf(kc.ReplayAddr())}})
	d5 := blockdigest.FromUint64s(5<<32, 5)
	publishUntil(t, kc, presenceStored("CPU", kvevents.HashBytes(d5[:])), "the replay buffer's blocks", func() bool {
		return s.EventIndex().Holds("a1", Key(ds[0])) != 0
	})
	for _, d := range ds[:3] {
		must.Eq(t, prefixindex.TierCPU, s.EventIndex().Holds("a1", Key(d)))
	}
	must.Eq(t, prefixindex.Tier(0), s.EventIndex().Holds("a1", Key(ds[3])), must.Sprint("over capacity"))
	st, _ := s.KVCacheStats("kc")
	must.Positive(t, st.Dropped)
	must.Positive(t, st.Replays)
}
