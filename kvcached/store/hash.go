package store

import (
	"math/bits"

	"lukechampine.com/blake3"
	"lukechampine.com/blake3/guts"
)

// blockSum returns BLAKE3-256(key || val), what blake3.New(32, nil) gives
// for the two written in turn, computed on the calling goroutine alone.
// The library's Hasher.Write starts a goroutine for every 16 KiB subtree of
// a large write (64 per 1 MiB block): goroutine creation and stack growth
// add to a disk write's CPU, and the hashing of a background disk write
// would spread over every P, ahead of the connections' requests.
//
// It hashes the same tree as the Hasher: 1 KiB chunks, the first holding
// the key and the start of the value, then the value's chunks straight out
// of val (16 at a time with the library's SIMD kernel where the subtree is
// aligned), merged on a stack of subtree roots, and the last chunk
// finalised as (or into) the root.
func blockSum(key string, val []byte) [32]byte {
	var h treeHasher
	total := len(key) + len(val)
	// The first chunk: the key and the start of the value. The stream's
	// last chunk is never compressed before the root (it carries the ROOT
	// flag when it is the only one), so a stream of one chunk ends here.
	var first [guts.ChunkSize]byte
	n := copy(first[:], key)
	if len(key) > guts.ChunkSize {
		// Keys over 1 KiB do not occur (Redis clients send short keys),
		// but stay correct: hash the key's chunks out of a copy.
		return slowSum(key, val)
	}
	n += copy(first[n:], val)
	rest := val[n-len(key):]
	if total <= guts.ChunkSize {
		return h.root(first[:n])
	}
	h.push(guts.ChainingValue(guts.CompressChunk(first[:], &guts.IV, 0, 0)), 0)
	// Full chunks other than the last one.
	full := (len(rest) - 1) / guts.ChunkSize
	for full > 0 {
		if h.counter%guts.MaxSIMD == 0 && full >= guts.MaxSIMD {
			buf := (*[guts.MaxSIMD * guts.ChunkSize]byte)(rest[:guts.MaxSIMD*guts.ChunkSize])
			node := guts.CompressBuffer(buf, len(buf), &guts.IV, h.counter, 0)
			h.push(guts.ChainingValue(node), bits.TrailingZeros(guts.MaxSIMD))
			rest, full = rest[len(buf):], full-guts.MaxSIMD
			continue
		}
		h.push(guts.ChainingValue(guts.CompressChunk(rest[:guts.ChunkSize], &guts.IV, h.counter, 0)), 0)
		rest, full = rest[guts.ChunkSize:], full-1
	}
	return h.root(rest)
}

// treeHasher is the stack of subtree roots a BLAKE3 hasher keeps: counter
// is the number of chunks hashed, and bit i of it says stack[i] is in use.
type treeHasher struct {
	stack   [64][8]uint32
	counter uint64
}

func (h *treeHasher) push(cv [8]uint32, height int) {
	i := height
	for h.counter&(1<<i) != 0 {
		cv = guts.ChainingValue(guts.ParentNode(h.stack[i], cv, &guts.IV, 0))
		i++
	}
	h.stack[i] = cv
	h.counter += 1 << height
}

// root finalises the tree with its last chunk and returns the 256-bit hash.
func (h *treeHasher) root(last []byte) [32]byte {
	n := guts.CompressChunk(last, &guts.IV, h.counter, 0)
	for i := bits.TrailingZeros64(h.counter); i < bits.Len64(h.counter); i++ {
		if h.counter&(1<<i) != 0 {
			n = guts.ParentNode(h.stack[i], guts.ChainingValue(n), &guts.IV, 0)
		}
	}
	n.Flags |= guts.FlagRoot
	out := guts.WordsToBytes(guts.CompressNode(n))
	return [32]byte(out[:32])
}

// slowSum hashes key || val by copying them into one buffer.
func slowSum(key string, val []byte) [32]byte {
	b := make([]byte, 0, len(key)+len(val))
	return blockSum("", append(append(b, key...), val...))
}

// readSum is blockSum for a block read from disk to answer a request: the
// library's hasher spreads a large value over every core, which costs more
// CPU than blockSum but less time, and a request is waiting for it
// (BENCHMARKS.md, oasis-kvcached: SSD-tier GET).
func readSum(key string, val []byte) [32]byte {
	var sum [32]byte
	h := blake3.New(32, nil)
	h.Write([]byte(key))
	h.Write(val)
	h.Sum(sum[:0])
	return sum
}
