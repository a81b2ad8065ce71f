package engine

import "math/bits"

// slotMap maps block hashes to slot indexes (≥ 0) with open addressing and
// linear probing: key and value share one 16-byte entry, so a lookup in a
// table of millions of blocks costs one cache miss where a Go map costs two.
// Deletion shifts the following entries back, so there are no tombstones.
type slotMap struct {
	entries []slotEntry
	n       int
	shift   uint8
}

type slotEntry struct {
	key uint64
	val int32 // slot + 1; 0 marks an empty entry
}

func newSlotMap() *slotMap {
	m := &slotMap{}
	m.init(64)
	return m
}

func (m *slotMap) init(size int) {
	m.entries = make([]slotEntry, size)
	m.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	m.n = 0
}

func (m *slotMap) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> m.shift) }

func (m *slotMap) len() int { return m.n }

func (m *slotMap) get(k uint64) (int32, bool) {
	mask := len(m.entries) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		e := &m.entries[i]
		if e.val == 0 {
			return 0, false
		}
		if e.key == k {
			return e.val - 1, true
		}
	}
}

// put maps k to v (v ≥ 0), replacing any previous value.
func (m *slotMap) put(k uint64, v int32) {
	if (m.n+1)*4 > len(m.entries)*3 {
		old := m.entries
		m.init(len(old) * 2)
		for _, e := range old {
			if e.val != 0 {
				m.put(e.key, e.val-1)
			}
		}
	}
	mask := len(m.entries) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		e := &m.entries[i]
		if e.val == 0 {
			*e = slotEntry{k, v + 1}
			m.n++
			return
		}
		if e.key == k {
			e.val = v + 1
			return
		}
	}
}

// del removes k if present.
func (m *slotMap) del(k uint64) {
	mask := len(m.entries) - 1
	i := m.home(k)
	for {
		e := &m.entries[i]
		if e.val == 0 {
			return
		}
		if e.key == k {
			break
		}
		i = (i + 1) & mask
	}
	// Shift back every following entry whose home is not in (i, j].
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		e := m.entries[j]
		if e.val == 0 {
			break
		}
		h := m.home(e.key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.entries[i] = e
			i = j
		}
	}
	m.entries[i] = slotEntry{}
	m.n--
}
