// Package blockdigest computes Oasis's sequence-chained block digests: the
// identity of a KV-cache block that the router, oasis-kvcached and oasis-sim
// share, independent of any engine's own block hash.
//
// A token sequence is cut into blocks of BlockSize tokens; only full blocks
// get a digest (engines never cache a partial block). Digest i covers blocks
// 0..i, so the same tokens at another position, or after another prefix,
// never match.
//
// # Byte layout (version 2)
//
// The domain tag separates models, LoRA adapters and cache salts:
//
//	material = le32(len(model)) || model || le32(len(lora)) || lora || le32(len(salt)) || salt
//	key      = BLAKE3-DeriveKey(context = "oasis 2026-11-21 blockdigest v2", material)   (32 bytes)
//	tag      = key[:16]
//
// Each block's digest is BLAKE3 in keyed mode, keyed by its parent's digest
// and the domain tag, over the block's token ids, truncated to 16 bytes:
//
//	digest_i = BLAKE3-keyed(key = digest_{i-1} || tag, le32(tok_0) || ... || le32(tok_{B-1}))[:16]
//
// where digest_{-1} is Root (16 zero bytes) and le32 is the little-endian
// uint32 encoding. The block size is bound in implicitly: BLAKE3 encodes the
// input length (4×BlockSize bytes). Lengths of the strings in the material are
// prefixed so that ("a", "bc") and ("ab", "c") differ.
//
// Why the parent goes into the key rather than the input: a block of 16
// tokens is 64 bytes, exactly one BLAKE3 block, so each digest costs one
// compression (version 1 hashed parent || tokens, 80 bytes, two compressions).
// Chaining through the key is how BLAKE3 itself chains blocks within a chunk.
//
// # Why 128 bits
//
// The router keeps one index entry per (block, worker) and targets ≤ 64 bytes
// per entry; a 16-byte digest leaves room for the worker id, tier and list
// links where a 32-byte one would take half the budget. A collision among
// n blocks has probability ≈ n²/2¹²⁹: for 10¹² blocks ever indexed, < 10⁻¹⁴.
// Digests are not secrets or MACs; a collision costs at worst a cache miss
// (kvcached also checksums every stored block separately).
package blockdigest

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"lukechampine.com/blake3"
	"lukechampine.com/blake3/guts"
)

// Size is the length of a digest in bytes.
const Size = 16

// keyContext is the BLAKE3 key-derivation context; changing the layout means
// changing this string (and the test vectors).
const keyContext = "oasis 2026-11-21 blockdigest v2"

// Digest identifies a block and the whole prefix before it.
type Digest [Size]byte

// Root is the parent of a sequence's first block.
var Root Digest

// IsRoot reports whether d is the zero digest, the parent of block 0.
func (d Digest) IsRoot() bool { return d == Root }

// String returns the lowercase hex form of d.
func (d Digest) String() string { return hex.EncodeToString(d[:]) }

// Hi and Lo return the digest as two big-endian uint64 halves, for indexes
// that prefer integer keys.
func (d Digest) Hi() uint64 { return binary.BigEndian.Uint64(d[:8]) }

// Lo returns the low half of d; see Hi.
func (d Digest) Lo() uint64 { return binary.BigEndian.Uint64(d[8:]) }

// FromUint64s is the inverse of Hi and Lo.
func FromUint64s(hi, lo uint64) Digest {
	var d Digest
	binary.BigEndian.PutUint64(d[:8], hi)
	binary.BigEndian.PutUint64(d[8:], lo)
	return d
}

// Domain separates digest spaces: the same tokens under another model, LoRA
// adapter or cache salt give unrelated digests.
type Domain struct {
	Model     string // served model name; required
	LoRA      string // LoRA adapter name, empty for the base model
	CacheSalt string // per-tenant cache salt, empty for none
}

// Key derives the 32-byte key of the domain; its first 16 bytes are the
// domain tag that keys every block digest.
func (d Domain) Key() [32]byte {
	material := make([]byte, 0, 12+len(d.Model)+len(d.LoRA)+len(d.CacheSalt))
	for _, s := range [...]string{d.Model, d.LoRA, d.CacheSalt} {
		material = binary.LittleEndian.AppendUint32(material, uint32(len(s)))
		material = append(material, s...)
	}
	var key [32]byte
	blake3.DeriveKey(key[:], keyContext, material)
	return key
}

// Hasher computes digests for one domain and block size. It is not safe for
// concurrent use; Clone gives each goroutine its own cheaply.
type Hasher struct {
	key       [32]byte
	tag       [4]uint32 // key[:16] as little-endian words
	blockSize int
	buf       []byte // 4*blockSize bytes, reused for blocks of more than 16 tokens
}

// New returns a Hasher for domain d and blocks of blockSize tokens.
func New(d Domain, blockSize int) (*Hasher, error) {
	if d.Model == "" {
		return nil, errors.New("creating block hasher: model name is required")
	}
	if blockSize <= 0 {
		return nil, fmt.Errorf("creating block hasher: block size %d must be positive", blockSize)
	}
	return newWithKey(d.Key(), blockSize), nil
}

func newWithKey(key [32]byte, blockSize int) *Hasher {
	h := &Hasher{key: key, blockSize: blockSize}
	for i := range h.tag {
		h.tag[i] = binary.LittleEndian.Uint32(key[4*i:])
	}
	if blockSize > guts.BlockSize/4 {
		h.buf = make([]byte, 4*blockSize)
	}
	return h
}

// Clone returns an independent Hasher for the same domain and block size,
// without re-deriving the key.
func (h *Hasher) Clone() *Hasher { return newWithKey(h.key, h.blockSize) }

// BlockSize returns the number of tokens per block.
func (h *Hasher) BlockSize() int { return h.blockSize }

// Extend returns the digest of one block of tokens following parent (Root for
// the first block). block must hold exactly BlockSize tokens.
func (h *Hasher) Extend(parent Digest, block []uint32) (Digest, error) {
	if len(block) != h.blockSize {
		return Digest{}, fmt.Errorf("extending digest: block has %d tokens, block size is %d", len(block), h.blockSize)
	}
	return h.extend(parent, block), nil
}

const flagsKeyedRoot = guts.FlagChunkStart | guts.FlagChunkEnd | guts.FlagRoot | guts.FlagKeyedHash

func (h *Hasher) extend(parent Digest, block []uint32) Digest {
	var key [8]uint32
	for i := 0; i < 4; i++ {
		key[i] = binary.LittleEndian.Uint32(parent[4*i:])
	}
	copy(key[4:], h.tag[:])
	var out [16]uint32
	switch n := 4 * len(block); {
	case n <= guts.BlockSize:
		// One BLAKE3 block: the token ids are its little-endian words as is.
		var m [16]uint32
		copy(m[:], block)
		o := compress16(&key, &m, uint32(n), flagsKeyedRoot)
		copy(out[:], o[:])
	case n <= guts.ChunkSize:
		// One chunk of several blocks: what blake3.Hasher.Sum does for it.
		h.fill(block)
		node := guts.CompressChunk(h.buf, &key, 0, guts.FlagKeyedHash)
		node.Flags |= guts.FlagRoot
		out = guts.CompressNode(node)
	default:
		var kb [32]byte
		copy(kb[:], parent[:])
		for i, w := range h.tag {
			binary.LittleEndian.PutUint32(kb[16+4*i:], w)
		}
		b := blake3.New(Size, kb[:])
		h.fill(block)
		b.Write(h.buf)
		var d Digest
		b.Sum(d[:0])
		return d
	}
	var d Digest
	for i := 0; i < 4; i++ {
		binary.LittleEndian.PutUint32(d[4*i:], out[i])
	}
	return d
}

func (h *Hasher) fill(block []uint32) {
	for i, t := range block {
		binary.LittleEndian.PutUint32(h.buf[4*i:], t)
	}
}

// AppendDigests appends to dst the digests of every full block of tokens,
// chained from parent (Root when tokens start the sequence), and returns the
// extended slice. A trailing partial block is ignored. With enough capacity
// in dst it does not allocate (block sizes up to 256 tokens).
func (h *Hasher) AppendDigests(dst []Digest, parent Digest, tokens []uint32) []Digest {
	for len(tokens) >= h.blockSize {
		parent = h.extend(parent, tokens[:h.blockSize])
		dst = append(dst, parent)
		tokens = tokens[h.blockSize:]
	}
	return dst
}

// Digests returns the digests of every full block of a sequence from its start.
func (h *Hasher) Digests(tokens []uint32) []Digest {
	return h.AppendDigests(make([]Digest, 0, len(tokens)/h.blockSize), Root, tokens)
}
