package resp

import "sync"

// Budget bounds the bytes of large arguments that all connections together
// hold between reading a command and finishing it (and, through Acquire, the
// buffers of peer fetches), so many clients sending
// 32 MiB values at once cannot push the process far past its RAM tier. A
// reader that already holds part of the budget for the current command is
// never blocked (a command larger than the whole budget still goes through,
// alone), so a connection cannot deadlock on itself.
type Budget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	limit int64
	used  int64
}

// NewBudget returns a Budget of limit bytes.
func NewBudget(limit int64) *Budget {
	b := &Budget{limit: limit}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// acquire takes n bytes, waiting while the budget is spent unless the caller
// already holds some (held > 0).
func (b *Budget) acquire(n, held int64) {
	b.mu.Lock()
	for held == 0 && b.used > 0 && b.used+n > b.limit {
		b.cond.Wait()
	}
	b.used += n
	b.mu.Unlock()
}

func (b *Budget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
	b.cond.Broadcast()
}

// InUse returns the bytes currently held.
func (b *Budget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

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
