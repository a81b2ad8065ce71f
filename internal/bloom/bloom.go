// Package bloom is a Bloom filter over string keys with a fixed wire form,
// shared by processes that exchange filters: kvcached peers (block keys) and
// federated routers (hot prefix digests). Hashing is FNV-1a with double
// hashing (Kirsch–Mitzenmacher), identical across processes.
//
// Wire form: k u8 | m u32 little-endian (bits) | m/8 bytes.
package bloom

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"math/bits"
)

// Filter is a Bloom filter. The zero value and nil hold nothing.
type Filter struct {
	k    uint8
	m    uint32
	bits []byte
}

// bitsPerKey and numHashes give a ~1% false-positive rate.
const (
	bitsPerKey = 10
	numHashes  = 7
)

// ErrMalformed is a wire form that is not a filter.
var ErrMalformed = errors.New("bloom: malformed filter")

// New returns an empty filter sized for n keys (at least 64).
func New(n int) *Filter {
	m := uint64(max(n, 64)) * bitsPerKey
	m = (m + 7) &^ 7
	if m > math.MaxUint32-7 {
		m = (math.MaxUint32 - 7) &^ 7
	}
	return &Filter{k: numHashes, m: uint32(m), bits: make([]byte, m/8)}
}

func keyHashes(key string) (uint64, uint64) {
	h := fnv.New64a()
	h.Write([]byte(key))
	a := h.Sum64()
	// A second, independent-enough hash: mix a with a murmur3 finaliser.
	b := a ^ (a >> 33)
	b *= 0xff51afd7ed558ccd
	b ^= b >> 33
	b *= 0xc4ceb9fe1a85ec53
	b ^= b >> 33
	return a, b | 1
}

// Add inserts key.
func (f *Filter) Add(key string) {
	a, b := keyHashes(key)
	for i := uint64(0); i < uint64(f.k); i++ {
		bit := (a + i*b) % uint64(f.m)
		f.bits[bit/8] |= 1 << (bit % 8)
	}
}

// MayHave reports whether key may have been added (false: it was not).
func (f *Filter) MayHave(key string) bool {
	if f == nil || f.m == 0 {
		return false
	}
	a, b := keyHashes(key)
	for i := uint64(0); i < uint64(f.k); i++ {
		bit := (a + i*b) % uint64(f.m)
		if f.bits[bit/8]&(1<<(bit%8)) == 0 {
			return false
		}
	}
	return true
}

// Marshal returns the wire form.
func (f *Filter) Marshal() []byte {
	out := make([]byte, 5, 5+len(f.bits))
	out[0] = f.k
	binary.LittleEndian.PutUint32(out[1:], f.m)
	return append(out, f.bits...)
}

// Unmarshal decodes a wire form (untrusted input); the filter shares b.
func Unmarshal(b []byte) (*Filter, error) {
	if len(b) < 5 {
		return nil, ErrMalformed
	}
	f := &Filter{k: b[0], m: binary.LittleEndian.Uint32(b[1:])}
	if f.k == 0 || f.k > 32 || f.m%8 != 0 || uint64(len(b)-5) != uint64(f.m/8) {
		return nil, ErrMalformed
	}
	f.bits = b[5:]
	return f, nil
}

// Limits bound a filter from another process: its size, its number of
// hashes, and how full it may be. A filter past them matches too much to be
// evidence of anything (an all-ones filter matches every key).
type Limits struct {
	MinBits, MaxBits uint32 // m
	MinK, MaxK       uint8  // k
	// MaxFalsePositive bounds the false-positive rate the filter's fill
	// implies (fill^k): New's filters, at 10 bits and 7 hashes per key, are
	// under 1% when holding the keys they were sized for.
	MaxFalsePositive float64
}

// DefaultLimits accept what New makes, for up to 2^16 keys, and refuse a
// filter whose fill implies more than 5% false positives.
func DefaultLimits() Limits {
	return Limits{MinBits: 64 * bitsPerKey, MaxBits: 1 << 16 * bitsPerKey, MinK: 1, MaxK: 16, MaxFalsePositive: 0.05}
}

// LimitError is a filter outside Limits; Field names what (bits, k, fill).
type LimitError struct {
	Field string
	Value float64
	Limit string
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("bloom: filter %s %g outside %s", e.Field, e.Value, e.Limit)
}

// FillRatio is the share of bits set.
func (f *Filter) FillRatio() float64 {
	if f == nil || f.m == 0 {
		return 0
	}
	n := 0
	for _, b := range f.bits {
		n += bits.OnesCount8(b)
	}
	return float64(n) / float64(f.m)
}

// FalsePositiveRate is the rate the filter's fill implies: fill^k.
func (f *Filter) FalsePositiveRate() float64 {
	if f == nil || f.m == 0 {
		return 0
	}
	return math.Pow(f.FillRatio(), float64(f.k))
}

// Check reports whether f is within l (nil is: it holds nothing).
func (f *Filter) Check(l Limits) error {
	if f == nil {
		return nil
	}
	switch {
	case f.m < l.MinBits || f.m > l.MaxBits:
		return &LimitError{Field: "bits", Value: float64(f.m), Limit: fmt.Sprintf("[%d, %d]", l.MinBits, l.MaxBits)}
	case f.k < l.MinK || f.k > l.MaxK:
		return &LimitError{Field: "k", Value: float64(f.k), Limit: fmt.Sprintf("[%d, %d]", l.MinK, l.MaxK)}
	}
	if p := f.FalsePositiveRate(); p > l.MaxFalsePositive {
		return &LimitError{Field: "fill", Value: f.FillRatio(),
			Limit: fmt.Sprintf("a false-positive rate of %g (it implies %.3g at k=%d)", l.MaxFalsePositive, p, f.k)}
	}
	return nil
}
