package resp

import (
	"sync"
	"sync/atomic"
)

// Budget bounds the bytes of large arguments that all connections together
// hold between reading a command and finishing it (and, through Acquire, the
// buffers of peer fetches), so many clients sending
// 32 MiB values at once cannot push the process far past its RAM tier. A
// reader that already holds part of the budget for the current command is
// never blocked (a command larger than the whole budget still goes through,
// alone), so a connection cannot deadlock on itself.
type Budget struct {
	limit int64
	// used is taken and given back without the mutex: every SET of a value
	// over 64 bytes does both, on every connection, so a lock here is one
	// more contended lock per command. mu and cond serve only the waiters.
	used    atomic.Int64
	waiters atomic.Int32
	mu      sync.Mutex
	cond    *sync.Cond
}

// NewBudget returns a Budget of limit bytes.
func NewBudget(limit int64) *Budget {
	b := &Budget{limit: limit}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// tryAcquire takes n bytes if they fit, if nothing is held (a value larger
// than the whole budget goes through alone) or if the caller already holds
// some (held > 0).
func (b *Budget) tryAcquire(n, held int64) bool {
	for {
		u := b.used.Load()
		if held == 0 && u > 0 && u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// acquire takes n bytes, waiting while the budget is spent unless the caller
// already holds some (held > 0).
func (b *Budget) acquire(n, held int64) {
	if b.tryAcquire(n, held) {
		return
	}
	b.mu.Lock()
	// Registered before the retry: a release that lands after the failed
	// retry sees the waiter and broadcasts under mu, which it can take only
	// once this goroutine waits.
	b.waiters.Add(1)
	for !b.tryAcquire(n, held) {
		b.cond.Wait()
	}
	b.waiters.Add(-1)
	b.mu.Unlock()
}

func (b *Budget) release(n int64) {
	if n == 0 {
		return
	}
	b.used.Add(-n)
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	}
}

// InUse returns the bytes currently held.
func (b *Budget) InUse() int64 { return b.used.Load() }

// Acquire takes n bytes for a holder outside the readers (peer fetches and
// the blocks served to peers), waiting while the budget is spent; an n
// larger than the whole budget goes through once nothing else is held.
func (b *Budget) Acquire(n int64) {
	if n > 0 {
		b.acquire(n, 0)
	}
}

// Release gives back n bytes taken with Acquire.
func (b *Budget) Release(n int64) { b.release(n) }
