package cachestate

import (
	"math/bits"

	"github.com/oasis-llm/oasis/internal/blockdigest"
)

// hashMap maps engine block hashes to Oasis digests: open addressing with
// linear probing and backward-shift deletion, keys and values in parallel
// arrays. Engine hashes are already well mixed, so a multiply is the whole
// hash function; it is about twice as fast as a Go map for this key/value
// shape on the ingest path.
type hashMap struct {
	keys  []uint64
	vals  []blockdigest.Digest
	used  []bool
	n     int
	shift uint8
}

func newHashMap() *hashMap {
	m := &hashMap{}
	m.init(64)
	return m
}

func (m *hashMap) init(size int) {
	m.keys = make([]uint64, size)
	m.vals = make([]blockdigest.Digest, size)
	m.used = make([]bool, size)
	m.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	m.n = 0
}

func (m *hashMap) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> m.shift) }

func (m *hashMap) len() int { return m.n }

func (m *hashMap) get(k uint64) (blockdigest.Digest, bool) {
	mask := len(m.keys) - 1
	for s := m.home(k); ; s = (s + 1) & mask {
		if !m.used[s] {
			return blockdigest.Digest{}, false
		}
		if m.keys[s] == k {
			return m.vals[s], true
		}
	}
}

func (m *hashMap) put(k uint64, d blockdigest.Digest) {
	if (m.n+1)*4 > len(m.keys)*3 {
		m.grow()
	}
	mask := len(m.keys) - 1
	for s := m.home(k); ; s = (s + 1) & mask {
		if !m.used[s] {
			m.used[s], m.keys[s], m.vals[s] = true, k, d
			m.n++
			return
		}
		if m.keys[s] == k {
			m.vals[s] = d
			return
		}
	}
}

func (m *hashMap) del(k uint64) {
	mask := len(m.keys) - 1
	s := m.home(k)
	for ; ; s = (s + 1) & mask {
		if !m.used[s] {
			return
		}
		if m.keys[s] == k {
			break
		}
	}
	m.n--
	for {
		m.used[s] = false
		j := s
		for {
			j = (j + 1) & mask
			if !m.used[j] {
				return
			}
			h := m.home(m.keys[j])
			if (j > s && (h <= s || h > j)) || (j < s && (h <= s && h > j)) {
				m.used[s], m.keys[s], m.vals[s] = true, m.keys[j], m.vals[j]
				s = j
				break
			}
		}
	}
}

func (m *hashMap) grow() {
	keys, vals, used := m.keys, m.vals, m.used
	m.init(len(keys) * 2)
	for i, u := range used {
		if u {
			m.put(keys[i], vals[i])
		}
	}
}
