package cachestate

import (
	"runtime"
	"testing"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// BenchmarkApplyStored measures event ingest through the full learning path
// on one core: BlockStored events of 16 blocks × 16 tokens, each chained to
// the previous event's last block, digested with BLAKE3 and stored in the
// index, with BlockRemoved events keeping the worker at ~1M blocks.
func BenchmarkApplyStored(b *testing.B) {
	const blockSize, perEvent = 16, 16
	ix := prefixindex.New(prefixindex.Config{})
	_ = ix.AddWorker("e1", 0)
	ew := NewEventWorker("e1", "model-a", ix, NewDigester())
	tokens := make([]int32, blockSize*perEvent)
	var hash uint64
	var parent *kvevents.Hash
	mk := func(i int) kvevents.Message {
		hashes := make([]kvevents.Hash, perEvent)
		for j := range hashes {
			hash++
			hashes[j] = kvevents.HashUint64(hash)
		}
		for j := range tokens {
			tokens[j] = int32(i*7919 + j)
		}
		ev := kvevents.BlockStored{BlockHashes: hashes, ParentBlockHash: parent, TokenIDs: tokens, BlockSize: blockSize}
		p := hashes[perEvent-1]
		parent = &p
		evs := []kvevents.Event{ev}
		if hash > 1<<20 {
			old := make([]kvevents.Hash, perEvent)
			for j := range old {
				old[j] = kvevents.HashUint64(hash - 1<<20 + uint64(j) - perEvent)
			}
			evs = append(evs, kvevents.BlockRemoved{BlockHashes: old})
		}
		return kvevents.Message{Seq: int64(i), Batch: kvevents.EventBatch{Events: evs}}
	}
	for i := 0; i < (1<<20)/perEvent; i++ {
		if err := ew.Apply(mk(i), 0); err != nil {
			b.Fatal(err)
		}
	}
	msgs := make([]kvevents.Message, b.N)
	for i := range msgs {
		msgs[i] = mk((1<<20)/perEvent + i)
	}
	b.ResetTimer()
	for i := range msgs {
		if err := ew.Apply(msgs[i], 0); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N*perEvent)/b.Elapsed().Seconds(), "blocks/s")
	if ew.Stats().Orphans != 0 {
		b.Fatalf("%d orphans", ew.Stats().Orphans)
	}
}

// ingestPayloads encodes n EventBatches the way oasis-sim (and vLLM with
// msgspec's array_like default) publishes them: one BlockStored of perEvent
// blocks of blockSize tokens per batch, chained to the previous batch's last
// block, token ids spread over a 128k vocabulary; once the worker holds 1M
// blocks (its index capacity), each batch first removes the oldest perEvent
// blocks.
func ingestPayloads(tb testing.TB, first, n int) [][]byte {
	tb.Helper()
	const blockSize, perEvent, vocab = 16, 16, 128000
	out := make([][]byte, 0, n)
	rank := 0
	for i := first; i < first+n; i++ {
		hashes := make([]kvevents.Hash, perEvent)
		base := uint64(i * perEvent)
		for j := range hashes {
			hashes[j] = kvevents.HashUint64(base + uint64(j) + 1)
		}
		tokens := make([]int32, blockSize*perEvent)
		for j := range tokens {
			tokens[j] = int32((i*7919 + j*104729) % vocab)
		}
		ev := kvevents.BlockStored{BlockHashes: hashes, TokenIDs: tokens, BlockSize: blockSize, Medium: kvevents.MediumGPU}
		if i > 0 {
			p := kvevents.HashUint64(base)
			ev.ParentBlockHash = &p
		}
		var evs []kvevents.Event
		if base >= 1<<20 {
			// The evictions that made room come first, as oasis-sim and vLLM
			// order a step's events (blocks are evicted when allocated, stored
			// when full).
			old := make([]kvevents.Hash, perEvent)
			for j := range old {
				old[j] = kvevents.HashUint64(base - 1<<20 + uint64(j) + 1)
			}
			evs = append(evs, kvevents.BlockRemoved{BlockHashes: old, Medium: kvevents.MediumGPU})
		}
		evs = append(evs, ev)
		p, err := kvevents.Encode(kvevents.EventBatch{TS: float64(i), Events: evs, DataParallelRank: &rank}, kvevents.LayoutArray)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, p)
	}
	return out
}

// BenchmarkIngestEncoded measures the whole event-ingest path on one core:
// msgpack decoding of encoded EventBatches, BLAKE3 digests from the token ids,
// the engine-hash → digest map and the index, with the worker warm at ~1M
// blocks. "decode" is the subscriber's path (kvevents.Decode, a fresh batch
// per message); "decoder" reuses one kvevents.Decoder's buffers.
func BenchmarkIngestEncoded(b *testing.B) {
	const perEvent, warm = 16, (1 << 20) / 16
	for _, reuse := range []bool{false, true} {
		name := "decode"
		if reuse {
			name = "decoder"
		}
		b.Run(name, func(b *testing.B) {
			ix := prefixindex.New(prefixindex.Config{})
			_ = ix.AddWorker("e1", 0)
			ew := NewEventWorker("e1", "model-a", ix, NewDigester())
			var dec kvevents.Decoder
			apply := func(seq int, p []byte) {
				var batch kvevents.EventBatch
				var err error
				if reuse {
					batch, err = dec.Decode(p)
				} else {
					batch, err = kvevents.Decode(p)
				}
				if err != nil {
					b.Fatal(err)
				}
				if err := ew.Apply(kvevents.Message{Seq: int64(seq), Batch: batch}, 0); err != nil {
					b.Fatal(err)
				}
			}
			for i, p := range ingestPayloads(b, 0, warm) {
				apply(i, p)
			}
			payloads := ingestPayloads(b, warm, b.N)
			runtime.GC() // the encoding's garbage is not the ingest path's
			b.ResetTimer()
			for i, p := range payloads {
				apply(warm+i, p)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N*perEvent)/b.Elapsed().Seconds(), "blocks/s")
			if st := ew.Stats(); st.Orphans != 0 || st.Malformed != 0 {
				b.Fatalf("orphans %d, malformed %d", st.Orphans, st.Malformed)
			}
		})
	}
}
