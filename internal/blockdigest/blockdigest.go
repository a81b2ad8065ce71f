// Package blockdigest computes Oasis's sequence-chained block digests: the
// identity of a KV-cache block that the router, oasis-kvcached and oasis-sim
// share, independent of any engine's own block hash.
//
// A token sequence is cut into blocks of BlockSize tokens; only full blocks
// get a digest (engines never cache a partial block). Digest i covers blocks
// 0..i, so the same tokens at another position, or after another prefix,
// never match.
//
// # Byte layout (version 1)
//
// The domain key separates models, LoRA adapters and cache salts:
//
//	material = le32(len(model)) || model || le32(len(lora)) || lora || le32(len(salt)) || salt
//	key      = BLAKE3-DeriveKey(context = "oasis 2026-11-20 blockdigest v1", material)   (32 bytes)
//
// Each block's digest is the keyed BLAKE3 hash, truncated to 16 bytes:
//
//	digest_0 = BLAKE3-keyed(key, Root || le32(tok_0) || ... || le32(tok_{B-1}))[:16]
//	digest_i = BLAKE3-keyed(key, digest_{i-1} || le32(tokens of block i))[:16]
//
// where Root is 16 zero bytes and le32 is the little-endian uint32 encoding.
// The block size is bound in implicitly: the number of token bytes hashed is
// 4×BlockSize. Lengths of the strings in the material are prefixed so that
// ("a", "bc") and ("ab", "c") differ.
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
)

// Size is the length of a digest in bytes.
const Size = 16

// keyContext is the BLAKE3 key-derivation context; changing the layout means
// changing this string (and the test vectors).
const keyContext = "oasis 2026-11-20 blockdigest v1"

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

// Parse decodes the hex form of a digest.
func Parse(s string) (Digest, error) {
	var d Digest
	if hex.DecodedLen(len(s)) != Size {
		return d, fmt.Errorf("parsing digest %q: want %d hex characters", s, 2*Size)
	}
	if _, err := hex.Decode(d[:], []byte(s)); err != nil {
		return d, fmt.Errorf("parsing digest %q: %w", s, err)
	}
	return d, nil
}

// Domain separates digest spaces: the same tokens under another model, LoRA
// adapter or cache salt give unrelated digests.
type Domain struct {
	Model     string // served model name; required
	LoRA      string // LoRA adapter name, empty for the base model
	CacheSalt string // per-tenant cache salt, empty for none
}

// Key derives the 32-byte BLAKE3 key of the domain.
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
	blockSize int
	h         *blake3.Hasher
	buf       []byte // Size + 4*blockSize bytes, reused for every block
	sum       []byte // Size bytes, reused so Sum does not allocate
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
	return &Hasher{
		key:       key,
		blockSize: blockSize,
		h:         blake3.New(Size, key[:]),
		buf:       make([]byte, Size+4*blockSize),
		sum:       make([]byte, Size),
	}
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

func (h *Hasher) extend(parent Digest, block []uint32) Digest {
	buf := h.buf
	copy(buf, parent[:])
	for i, t := range block {
		binary.LittleEndian.PutUint32(buf[Size+4*i:], t)
	}
	h.h.Reset()
	h.h.Write(buf)
	var d Digest
	copy(d[:], h.h.Sum(h.sum[:0]))
	return d
}

// AppendDigests appends to dst the digests of every full block of tokens,
// chained from parent (Root when tokens start the sequence), and returns the
// extended slice. A trailing partial block is ignored. With enough capacity
// in dst it does not allocate.
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
