package cachestate

import (
	"crypto/sha256"
	"testing"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/shoenig/test/must"
)

const bs = 4

func toks(start, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(start + i)
	}
	return out
}

func i32(ts []uint32) []int32 {
	out := make([]int32, len(ts))
	for i, t := range ts {
		out[i] = int32(t)
	}
	return out
}

func h(v uint64) kvevents.Hash   { return kvevents.HashUint64(v) }
func hp(v uint64) *kvevents.Hash { x := h(v); return &x }

func stored(parent *kvevents.Hash, hashes []kvevents.Hash, tokens []uint32, medium string) kvevents.BlockStored {
	return kvevents.BlockStored{BlockHashes: hashes, ParentBlockHash: parent, TokenIDs: i32(tokens), BlockSize: bs, Medium: medium}
}

func msg(seq int64, evs ...kvevents.Event) kvevents.Message {
	return kvevents.Message{Seq: seq, Batch: kvevents.EventBatch{Events: evs}}
}

type fixture struct {
	ix  *prefixindex.Index
	dig *Digester
	ew  *EventWorker
}

func newFixture(t *testing.T) *fixture {
	ix := prefixindex.New(prefixindex.Config{})
	must.NoError(t, ix.AddWorker("e1", 0))
	dig := NewDigester()
	return &fixture{ix: ix, dig: dig, ew: NewEventWorker("e1", "model-a", ix, dig)}
}

// keys are the request keys of a token sequence, computed independently with
// blockdigest (the hash vectors themselves are blockdigest's tests).
func keys(t *testing.T, model string, tokens []uint32) []uint64 {
	hs, err := blockdigest.New(blockdigest.Domain{Model: model}, bs)
	must.NoError(t, err)
	var out []uint64
	for _, d := range hs.Digests(tokens) {
		out = append(out, d.Hi())
	}
	return out
}

func (f *fixture) matched(t *testing.T, tokens []uint32) (int, float64) {
	ms := f.ix.Match(keys(t, "model-a", tokens), prefixindex.DefaultTierWeights(), nil)
	if len(ms) == 0 {
		return 0, 0
	}
	must.SliceLen(t, 1, ms)
	return ms[0].Blocks, ms[0].Weighted
}

func TestDigesterMatchesBlockdigest(t *testing.T) {
	dig := NewDigester()
	tokens := toks(100, 4*bs+2) // trailing partial block is ignored
	got, err := dig.AppendKeys(nil, blockdigest.Domain{Model: "model-a"}, bs, tokens)
	must.NoError(t, err)
	must.Eq(t, keys(t, "model-a", tokens), got)
	must.SliceLen(t, 4, got)
	// Domain separation: another model gives other keys.
	other, err := dig.AppendKeys(nil, blockdigest.Domain{Model: "model-b"}, bs, tokens)
	must.NoError(t, err)
	must.NotEq(t, got[0], other[0])
	_, err = dig.AppendKeys(nil, blockdigest.Domain{}, bs, tokens)
	must.Error(t, err)
}

func TestStoredChainsAcrossEvents(t *testing.T) {
	f := newFixture(t)
	seq := toks(1, 5*bs)
	// Blocks 0-1 in one event, 2-4 in a later one chained by parent hash.
	must.NoError(t, f.ew.Apply(msg(0, stored(nil, []kvevents.Hash{h(10), h(11)}, seq[:2*bs], "")), 0))
	must.NoError(t, f.ew.Apply(msg(1, stored(hp(11), []kvevents.Hash{h(12), h(13), h(14)}, seq[2*bs:], "GPU")), 0))
	n, w := f.matched(t, seq)
	must.Eq(t, 5, n)
	must.Eq(t, 5.0, w)
	// A request diverging after block 2 matches 3 blocks.
	other := append(append([]uint32{}, seq[:3*bs]...), toks(900, 2*bs)...)
	n, _ = f.matched(t, other)
	must.Eq(t, 3, n)
	must.Eq(t, int64(5), f.ew.Stats().BlocksStored)
	must.Eq(t, 5, f.ew.KnownHashes())
}

// The same block content at another position never matches: digests chain.
func TestPositionalCorrectness(t *testing.T) {
	f := newFixture(t)
	a, b := toks(1, bs), toks(50, bs)
	must.NoError(t, f.ew.Apply(msg(0, stored(nil, []kvevents.Hash{h(1), h(2)}, append(append([]uint32{}, a...), b...), "")), 0))
	n, _ := f.matched(t, b) // b at position 0
	must.Eq(t, 0, n)
	n, _ = f.matched(t, append(append([]uint32{}, b...), a...))
	must.Eq(t, 0, n)
	n, _ = f.matched(t, append(append([]uint32{}, a...), b...))
	must.Eq(t, 2, n)
}

func TestRemovedAndTiers(t *testing.T) {
	f := newFixture(t)
	seq := toks(1, 3*bs)
	hashes := []kvevents.Hash{h(1), h(2), h(3)}
	must.NoError(t, f.ew.Apply(msg(0,
		stored(nil, hashes, seq, "GPU"),
		stored(nil, hashes, seq, "CPU"), // offloaded copy, same engine hashes
	), 0))
	n, w := f.matched(t, seq)
	must.Eq(t, 3, n)
	must.Eq(t, 3.0, w)
	// Evicted from GPU: the CPU copy still counts, at the CPU weight.
	must.NoError(t, f.ew.Apply(msg(1, kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{h(3)}, Medium: "GPU"}), 0))
	n, w = f.matched(t, seq)
	must.Eq(t, 3, n)
	must.Eq(t, 2.75, w)
	must.Eq(t, 3, f.ew.KnownHashes())
	// Gone from CPU too: the prefix ends at block 2 and the hash is forgotten.
	must.NoError(t, f.ew.Apply(msg(2, kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{h(3), h(99)}, Medium: "CPU"}), 0))
	n, _ = f.matched(t, seq)
	must.Eq(t, 2, n)
	must.Eq(t, 2, f.ew.KnownHashes())
	// Removing block 0 breaks the whole prefix.
	must.NoError(t, f.ew.Apply(msg(3, kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{h(1)}, Medium: "GPU"}), 0))
	n, w = f.matched(t, seq)
	must.Eq(t, 2, n)
	must.Eq(t, 0.75+1, w)
	must.NoError(t, f.ew.Apply(msg(4, kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{h(1)}, Medium: "CPU"}), 0))
	n, _ = f.matched(t, seq)
	must.Eq(t, 0, n)
}

func TestAllBlocksCleared(t *testing.T) {
	f := newFixture(t)
	seq := toks(1, 2*bs)
	must.NoError(t, f.ew.Apply(msg(0, stored(nil, []kvevents.Hash{h(1), h(2)}, seq, "")), 0))
	must.NoError(t, f.ew.Apply(msg(1, kvevents.AllBlocksCleared{}), 0))
	n, _ := f.matched(t, seq)
	must.Eq(t, 0, n)
	must.Eq(t, 0, f.ew.KnownHashes())
	// A child of a cleared block cannot be digested: it is an orphan.
	must.NoError(t, f.ew.Apply(msg(2, stored(hp(2), []kvevents.Hash{h(3)}, toks(9, bs), "")), 0))
	must.Eq(t, int64(1), f.ew.Stats().Orphans)
	must.Eq(t, 0, f.ix.WorkerEntries("e1"))
}

func TestGapAndRestartResync(t *testing.T) {
	cases := []struct {
		name string
		next kvevents.Message
	}{
		{"sequence gap", kvevents.Message{Seq: 5, Missed: 3}},
		{"publisher restart", kvevents.Message{Seq: 0, Restarted: true}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			seq := toks(1, 2*bs)
			must.NoError(t, f.ew.Apply(msg(0, stored(nil, []kvevents.Hash{h(1), h(2)}, seq, "")), 0))
			n, _ := f.matched(t, seq)
			must.Eq(t, 2, n)
			// The batch after the gap carries a new block; the old ones must be
			// gone (a lost BlockRemoved may have dropped them), the new one kept.
			fresh := toks(500, bs)
			tc.next.Batch.Events = []kvevents.Event{stored(nil, []kvevents.Hash{h(7)}, fresh, "")}
			must.NoError(t, f.ew.Apply(tc.next, 0))
			n, _ = f.matched(t, seq)
			must.Eq(t, 0, n)
			n, _ = f.matched(t, fresh)
			must.Eq(t, 1, n)
			must.Eq(t, int64(1), f.ew.Stats().Resyncs)
			must.Eq(t, 1, f.ew.KnownHashes())
		})
	}
}

func TestByteHashesAndLoRA(t *testing.T) {
	f := newFixture(t)
	seq := toks(1, 2*bs)
	b0, b1 := sha256.Sum256([]byte("b0")), sha256.Sum256([]byte("b1"))
	ev := stored(nil, []kvevents.Hash{kvevents.HashBytes(b0[:])}, seq[:bs], "")
	must.NoError(t, f.ew.Apply(msg(0, ev), 0))
	p := kvevents.HashBytes(b0[:])
	must.NoError(t, f.ew.Apply(msg(1, stored(&p, []kvevents.Hash{kvevents.HashBytes(b1[:])}, seq[bs:], "")), 0))
	n, _ := f.matched(t, seq)
	must.Eq(t, 2, n)
	// A LoRA's blocks live in another digest domain: the base request misses.
	lora := stored(nil, []kvevents.Hash{h(77)}, toks(300, bs), "")
	lora.LoraName = "adapter-1"
	must.NoError(t, f.ew.Apply(msg(2, lora), 0))
	n, _ = f.matched(t, toks(300, bs))
	must.Eq(t, 0, n)
}

func TestMalformedEventsCounted(t *testing.T) {
	f := newFixture(t)
	bad := stored(nil, []kvevents.Hash{h(1), h(2)}, toks(1, bs), "") // 2 hashes, 1 block of tokens
	must.NoError(t, f.ew.Apply(msg(0, bad, stored(nil, []kvevents.Hash{h(3)}, toks(1, bs), "HBM?")), 0))
	must.Eq(t, int64(2), f.ew.Stats().Malformed)
	must.Eq(t, 0, f.ix.WorkerEntries("e1"))
}

// A gap filled from the engine's replay buffer keeps the worker's state; an
// incomplete replay resynchronises.
func TestApplyOrReplay(t *testing.T) {
	seq := toks(1, 3*bs)
	b0 := msg(0, stored(nil, []kvevents.Hash{h(1)}, seq[:bs], ""))
	b1 := msg(1, stored(hp(1), []kvevents.Hash{h(2)}, seq[bs:2*bs], ""))
	b2 := msg(2, stored(hp(2), []kvevents.Hash{h(3)}, seq[2*bs:], ""))
	buffer := []kvevents.Message{b0, b1, b2}
	fetch := func(from int64) ([]kvevents.Message, error) { return buffer[from:], nil }

	f := newFixture(t)
	must.NoError(t, f.ew.Apply(b0, 0))
	gap := b2
	gap.Missed = 1 // b1 was lost
	must.NoError(t, f.ew.ApplyOrReplay(gap, 0, fetch))
	n, _ := f.matched(t, seq)
	must.Eq(t, 3, n)
	must.Eq(t, int64(0), f.ew.Stats().Resyncs)
	must.Eq(t, int64(1), f.ew.Stats().Replays)

	// The buffer no longer has b1: resync, and b2 is an orphan.
	f = newFixture(t)
	must.NoError(t, f.ew.Apply(b0, 0))
	overrun := func(int64) ([]kvevents.Message, error) { return buffer[2:], nil }
	must.NoError(t, f.ew.ApplyOrReplay(gap, 0, overrun))
	n, _ = f.matched(t, seq)
	must.Eq(t, 0, n)
	must.Eq(t, int64(1), f.ew.Stats().Resyncs)
	must.Eq(t, int64(1), f.ew.Stats().Orphans)
}

// Tiers the engine never published itself (kvcached presence marks on the
// same worker) do not keep an engine hash mapped once the engine removes the
// block from every tier it did publish: the marks are withdrawn by presence,
// and a mapping left behind would never be freed.
func TestRemovedForgetsHashDespiteForeignTiers(t *testing.T) {
	f := newFixture(t)
	seq := toks(1, 2*bs)
	must.NoError(t, f.ew.Apply(msg(0, stored(nil, []kvevents.Hash{h(1), h(2)}, seq, "GPU")), 0))
	ks := keys(t, "model-a", seq)
	// kvcached's mark for the same worker, as presence.go records it.
	must.NoError(t, f.ix.Store("e1", prefixindex.TierCPU, ks, 0))
	must.NoError(t, f.ew.Apply(msg(1, kvevents.BlockRemoved{BlockHashes: []kvevents.Hash{h(2)}, Medium: "GPU"}), 0))
	must.Eq(t, 1, f.ew.KnownHashes())
	// The mark itself is presence's to withdraw: the block still counts at CPU weight.
	n, w := f.matched(t, seq)
	must.Eq(t, 2, n)
	must.Eq(t, 1.75, w)
}
