// Package u64map is a hash table from well-mixed uint64 keys (block hashes) to
// small values: open addressing with linear probing and backward-shift
// deletion over one array of key/value entries, so a lookup costs one cache
// miss where a Go map costs two. The keys are already hashes, so a multiply is
// the whole hash function. The router's event learner and oasis-sim's block
// tables keep millions of entries in it.
package u64map

import "math/bits"

// Map maps uint64 keys to values of V. The zero value of V marks an empty
// entry, so it cannot be stored: Put ignores it (callers that need it offset
// their values). A Map is not safe for concurrent use.
type Map[V comparable] struct {
	entries []entry[V]
	n       int
	shift   uint8
	sink    uint64 // keeps Warm's loads alive
}

type entry[V comparable] struct {
	key uint64
	val V
}

const minSize = 64

// New returns an empty map.
func New[V comparable]() *Map[V] {
	m := &Map[V]{}
	m.init(minSize)
	return m
}

func (m *Map[V]) init(size int) {
	m.entries = make([]entry[V], size)
	m.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	m.n = 0
}

func (m *Map[V]) home(k uint64) int { return int((k * 0x9E3779B97F4A7C15) >> m.shift) }

// Len is the number of keys.
func (m *Map[V]) Len() int { return m.n }

// Reset empties the map and gives its memory back.
func (m *Map[V]) Reset() { m.init(minSize) }

// Warm loads the home entries of keys, independently, so that the cache misses
// of a batch of lookups overlap.
func (m *Map[V]) Warm(keys []uint64) {
	var sink uint64
	for _, k := range keys {
		sink += m.entries[m.home(k)].key
	}
	m.sink = sink
}

// Get returns k's value.
func (m *Map[V]) Get(k uint64) (V, bool) {
	var zero V
	mask := len(m.entries) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		e := &m.entries[i]
		if e.val == zero {
			return zero, false
		}
		if e.key == k {
			return e.val, true
		}
	}
}

// Put maps k to v, replacing any previous value; a zero v is ignored.
func (m *Map[V]) Put(k uint64, v V) {
	var zero V
	if v == zero {
		return
	}
	if (m.n+1)*4 > len(m.entries)*3 {
		old := m.entries
		m.init(len(old) * 2)
		for _, e := range old {
			if e.val != zero {
				m.Put(e.key, e.val)
			}
		}
	}
	mask := len(m.entries) - 1
	for i := m.home(k); ; i = (i + 1) & mask {
		e := &m.entries[i]
		if e.val == zero {
			*e = entry[V]{k, v}
			m.n++
			return
		}
		if e.key == k {
			e.val = v
			return
		}
	}
}

// Delete removes k if present.
func (m *Map[V]) Delete(k uint64) {
	var zero V
	mask := len(m.entries) - 1
	i := m.home(k)
	for ; ; i = (i + 1) & mask {
		e := &m.entries[i]
		if e.val == zero {
			return
		}
		if e.key == k {
			break
		}
	}
	m.n--
	// Shift back every following entry of the run whose home is not in (i, j].
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		e := m.entries[j]
		if e.val == zero {
			break
		}
		h := m.home(e.key)
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			m.entries[i] = e
			i = j
		}
	}
	m.entries[i] = entry[V]{}
}
