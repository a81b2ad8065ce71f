package cachestate

import (
	"math/bits"

	"github.com/oasis-llm/oasis/internal/blockdigest"
)

// hashMap maps engine block hashes to Oasis digests: open addressing with
// linear probing and backward-shift deletion over one array of 24-byte
// entries, so a lookup costs one cache miss (parallel key/value/used arrays
// cost three). Engine hashes are already well mixed, so a multiply is the whole
// hash function; it is about twice as fast as a Go map for this key/value shape
// on the ingest path.
//
// An entry whose digest is Root (all zero) is empty. No real block has that
// digest (a 2⁻¹²⁸ chance), and put ignores it, so the block is merely unknown.
type hashMap struct {
	slots []hashEntry
	n     int
	shift uint8
	sink  uint64 // keeps warm's loads alive
}

type hashEntry struct {
	key uint64
	val blockdigest.Digest
}

func newHashMap() *hashMap {
	m := &hashMap{}
	m.init(64)
	return m
}

func (m *hashMap) init(size int) {
	m.slots = make([]hashEntry, size)
	m.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	m.n = 0
}

func (m *hashMap) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> m.shift) }

func (m *hashMap) len() int { return m.n }

// warm loads the home entries of keys, independently, so that the cache misses
// of a batch of lookups overlap.
func (m *hashMap) warm(keys []uint64) {
	var sink uint64
	for _, k := range keys {
		sink += m.slots[m.home(k)].key
	}
	m.sink = sink
}

func (m *hashMap) get(k uint64) (blockdigest.Digest, bool) {
	mask := len(m.slots) - 1
	for s := m.home(k); ; s = (s + 1) & mask {
		e := &m.slots[s]
		if e.val.IsRoot() {
			return blockdigest.Digest{}, false
		}
		if e.key == k {
			return e.val, true
		}
	}
}

func (m *hashMap) put(k uint64, d blockdigest.Digest) {
	if d.IsRoot() {
		return
	}
	if (m.n+1)*4 > len(m.slots)*3 {
		m.grow()
	}
	mask := len(m.slots) - 1
	for s := m.home(k); ; s = (s + 1) & mask {
		e := &m.slots[s]
		if e.val.IsRoot() {
			*e = hashEntry{k, d}
			m.n++
			return
		}
		if e.key == k {
			e.val = d
			return
		}
	}
}

func (m *hashMap) del(k uint64) {
	mask := len(m.slots) - 1
	s := m.home(k)
	for ; ; s = (s + 1) & mask {
		e := &m.slots[s]
		if e.val.IsRoot() {
			return
		}
		if e.key == k {
			break
		}
	}
	m.n--
	for {
		m.slots[s] = hashEntry{}
		j := s
		for {
			j = (j + 1) & mask
			e := m.slots[j]
			if e.val.IsRoot() {
				return
			}
			h := m.home(e.key)
			if (j > s && (h <= s || h > j)) || (j < s && (h <= s && h > j)) {
				m.slots[s] = e
				s = j
				break
			}
		}
	}
}

func (m *hashMap) grow() {
	old := m.slots
	m.init(len(old) * 2)
	for _, e := range old {
		if !e.val.IsRoot() {
			m.put(e.key, e.val)
		}
	}
}
