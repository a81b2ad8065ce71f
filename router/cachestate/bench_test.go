package cachestate

import (
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
