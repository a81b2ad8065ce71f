// Package bufpool recycles the buffers of large values.
//
// A large SET receives its value into a fresh buffer, and the kernel's copy
// out of the socket is then the copy into memory the CPU caches have not
// held since the garbage collector last freed it. Most large SETs replace a
// value of the same size (a key rewritten, or LMCache's fixed-size chunks
// evicting each other), so giving the replaced value's buffer to the next
// SET keeps that copy in cache, as redis-server's allocator does by handing
// the next value the block the replaced one freed.
package bufpool

import (
	"sync"

	"github.com/oasis-llm/oasis/kvcached/internal/nozero"
)

// MinSize is the smallest buffer a Pool keeps: smaller ones are cheap to
// allocate and stay in cache anyway.
const MinSize = 32 << 10

// Pool holds buffers given back for reuse, up to a byte limit, by exact
// size, most recently given back first (the one most likely still cached).
// A nil *Pool allocates every buffer and keeps none. Safe for concurrent use.
type Pool struct {
	mu    sync.Mutex
	free  map[int][][]byte
	held  int64
	limit int64
}

// New returns a Pool that holds at most limit bytes.
func New(limit int64) *Pool {
	return &Pool{free: make(map[int][][]byte), limit: limit}
}

// Get returns a buffer of length n whose contents are undefined: the caller
// must overwrite all of it before reading it.
func (p *Pool) Get(n int) []byte {
	if p != nil && n >= MinSize {
		p.mu.Lock()
		if l := p.free[n]; len(l) > 0 {
			b := l[len(l)-1]
			p.take(n, l)
			p.mu.Unlock()
			return b
		}
		p.mu.Unlock()
	}
	return nozero.Make(n)
}

// take drops the last of l, the list of size n. Under p.mu.
func (p *Pool) take(n int, l [][]byte) {
	l[len(l)-1] = nil
	if len(l) == 1 {
		delete(p.free, n)
	} else {
		p.free[n] = l[:len(l)-1]
	}
	p.held -= int64(n)
}

// Put gives b back for a later Get. The caller must hold the only reference
// to b and not use it afterwards. When the pool is full, buffers of other
// sizes make room (the workload's value size changed), else b is left to
// the garbage collector.
func (p *Pool) Put(b []byte) {
	n := len(b)
	if p == nil || n < MinSize || n != cap(b) || int64(n) > p.limit {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.held+int64(n) > p.limit {
		evicted := false
		for size, l := range p.free {
			if size != n {
				p.take(size, l)
				evicted = true
				break
			}
		}
		if !evicted {
			return
		}
	}
	p.free[n] = append(p.free[n], b)
	p.held += int64(n)
}

// Held reports the bytes the pool holds.
func (p *Pool) Held() int64 {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held
}
