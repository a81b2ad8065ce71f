package resp

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
)

// Budget bounds the bytes of large arguments that all connections together
// hold between reading a command and finishing it (and, through Acquire, the
// buffers of peer fetches), so many clients sending
// 32 MiB values at once cannot push the process far past its RAM tier.
//
// A reader takes each large argument's bytes before allocating it, and one
// command may hold at most the whole budget: a command whose arguments
// together need more is refused (OverBudgetError), since letting it through
// is what lets one command, or one per connection, multiply the process's
// memory. A reader that already holds bytes for its command waits like any
// other while the budget is spent, except when every reader holding bytes is
// waiting for more: then one of them (the overdraft) goes through, so
// readers cannot deadlock on each other, and the others wait for it to
// finish. The overdraft is the only way past the limit, and it is bounded by
// one command's share.
type Budget struct {
	limit int64
	// used is taken and given back without the mutex: every SET of a value
	// over 64 bytes does both, on every connection, so a lock here is one
	// more contended lock per command. mu and cond serve only the waiters.
	used    atomic.Int64
	waiters atomic.Int32
	// holders counts readers holding bytes for a command they are still
	// reading; stuck (under mu) those of them waiting for more. stuck ==
	// holders means no holder can make progress by itself.
	holders   atomic.Int32
	stuck     int32
	overdraft bool // under mu: a reader is past the limit
	mu        sync.Mutex
	cond      *sync.Cond
}

// NewBudget returns a Budget of limit bytes.
func NewBudget(limit int64) *Budget {
	b := &Budget{limit: limit}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// Limit returns the budget's size.
func (b *Budget) Limit() int64 { return b.limit }

// OverBudgetError refuses a command whose large arguments together need
// more than the whole in-flight budget. The reader has skipped the rest of
// the command, so the stream is still in sync.
type OverBudgetError struct{ Need, Limit int64 }

func (e *OverBudgetError) Error() string {
	return fmt.Sprintf("command's arguments need at least %d bytes, over the %d-byte in-flight memory limit", e.Need, e.Limit)
}

// tryAcquire takes n bytes if they fit, or if nothing is held at all (a
// value larger than the whole budget goes through alone).
func (b *Budget) tryAcquire(n int64) bool {
	for {
		u := b.used.Load()
		if u > 0 && u+n > b.limit {
			return false
		}
		if b.used.CompareAndSwap(u, u+n) {
			return true
		}
	}
}

// acquire takes n bytes, waiting while the budget is spent. held is what the
// caller already holds for its command; it reports whether the caller took
// the overdraft (see Budget), which it gives back with endOverdraft.
func (b *Budget) acquire(n, held int64) (overdraft bool) {
	overdraft, _ = b.acquireContext(context.Background(), n, held)
	return overdraft
}

// acquireContext is acquire that gives up, taking nothing, once ctx is done.
func (b *Budget) acquireContext(ctx context.Context, n, held int64) (overdraft bool, err error) {
	if b.tryAcquire(n) {
		return false, nil
	}
	if ctx.Done() != nil {
		stop := context.AfterFunc(ctx, func() {
			b.mu.Lock()
			b.cond.Broadcast()
			b.mu.Unlock()
		})
		defer stop()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	// Registered before the retry: a release that lands after the failed
	// retry sees the waiter and broadcasts under mu, which it can take only
	// once this goroutine waits.
	b.waiters.Add(1)
	defer b.waiters.Add(-1)
	if held > 0 {
		b.stuck++
		defer func() { b.stuck-- }()
		// Others may be waiting for the last holder to get stuck.
		b.cond.Broadcast()
	}
	for !b.tryAcquire(n) {
		if held > 0 && !b.overdraft && b.stuck >= b.holders.Load() {
			b.used.Add(n)
			b.overdraft = true
			return true, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		b.cond.Wait()
	}
	return false, nil
}

// leave takes a reader out of holders; stuck readers may now be all that
// is left.
func (b *Budget) leave() {
	b.holders.Add(-1)
	if b.waiters.Load() > 0 {
		b.mu.Lock()
		b.cond.Broadcast()
		b.mu.Unlock()
	}
}

// endOverdraft lets another stuck reader take the overdraft.
func (b *Budget) endOverdraft() {
	b.mu.Lock()
	b.overdraft = false
	b.cond.Broadcast()
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
// Such holders never wait while holding, so they take no part in the
// readers' overdraft.
func (b *Budget) Acquire(n int64) {
	if n > 0 {
		b.acquire(n, 0)
	}
}

// AcquireContext is Acquire that gives up once ctx is done, taking nothing.
// A command being run that needs budget (a peer fetch on a miss) uses it:
// its reader may still hold bytes, and the readers waiting for those bytes
// cannot take the overdraft while another command holds it, so only a
// deadline guarantees that one of them gives way.
func (b *Budget) AcquireContext(ctx context.Context, n int64) error {
	if n <= 0 {
		return nil
	}
	_, err := b.acquireContext(ctx, n, 0)
	return err
}

// Release gives back n bytes taken with Acquire.
func (b *Budget) Release(n int64) { b.release(n) }
