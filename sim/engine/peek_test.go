package engine

import "testing"

// CachedPrefixBlocks sees the blocks a finished request left in the cache,
// stops at the first missing one and changes nothing.
func TestCachedPrefixBlocks(t *testing.T) {
	e, err := New(Config{BlockSize: 4, NumGPUBlocks: 64})
	if err != nil {
		t.Fatal(err)
	}
	prompt := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	hashes := []uint64{BlockHash(0, false, prompt[:4])}
	hashes = append(hashes, BlockHash(hashes[0], true, prompt[4:8]))
	if n := e.CachedPrefixBlocks(hashes); n != 0 {
		t.Fatalf("empty cache: %d blocks", n)
	}
	if err := e.Submit(&Request{ID: "a", Prompt: prompt, Output: []int32{11}}); err != nil {
		t.Fatal(err)
	}
	for e.HasWork() {
		e.Step()
	}
	if n := e.CachedPrefixBlocks(hashes); n != 2 {
		t.Fatalf("after the request: %d blocks, want 2", n)
	}
	other := BlockHash(0, false, []int32{9, 9, 9, 9})
	if n := e.CachedPrefixBlocks([]uint64{hashes[0], other}); n != 1 {
		t.Fatalf("diverging second block: %d blocks, want 1", n)
	}
	before := e.Stats()
	e.CachedPrefixBlocks(hashes)
	if after := e.Stats(); after != before {
		t.Fatalf("stats changed: %+v -> %+v", before, after)
	}
}
