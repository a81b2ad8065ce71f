package h1

import (
	"context"
	"sync"
	"time"
)

// reqCtx is a request's context: cancelled when its handler returns or the
// client hangs up. It lives in the request's single allocation (exchange),
// creates its Done channel only when asked for it, and implements
// AfterFunc (the context package's afterFuncer), so contexts derived from
// it and context.AfterFunc on it start no goroutine. CancelHook and
// StopHook register a cancellation callback without allocating: the
// router's engine transport uses them to unblock its connection.
type reqCtx struct {
	mu     sync.Mutex
	done   chan struct{} // made on demand
	err    error
	nextID uint64
	hooks  [2]ctxHook
	more   []ctxHook
}

type ctxHook struct {
	id uint64 // 0: free slot
	f  func()
}

// closedChan is returned by Done after cancellation when nobody asked before.
var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

var _ context.Context = (*reqCtx)(nil)

func (c *reqCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (c *reqCtx) Value(any) any               { return nil }
func (c *reqCtx) String() string              { return "h1.requestContext" }

func (c *reqCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done == nil {
		if c.err != nil {
			return closedChan
		}
		c.done = make(chan struct{})
	}
	return c.done
}

func (c *reqCtx) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// cancel cancels the context (once) and starts every registered hook, each
// in its own goroutine, as context.AfterFunc does.
func (c *reqCtx) cancel() {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = context.Canceled
	if c.done != nil {
		close(c.done)
	}
	hooks, more := c.hooks, c.more
	c.hooks, c.more = [2]ctxHook{}, nil
	c.mu.Unlock()
	for _, h := range hooks {
		if h.id != 0 {
			go h.f()
		}
	}
	for _, h := range more {
		go h.f()
	}
}

// CancelHook arranges for f to run in its own goroutine once the context is
// cancelled (at once if it already is); id is for StopHook.
func (c *reqCtx) CancelHook(f func()) (id uint64) {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		go f()
		return 0
	}
	c.nextID++
	id = c.nextID
	h := ctxHook{id: id, f: f}
	switch {
	case c.hooks[0].id == 0:
		c.hooks[0] = h
	case c.hooks[1].id == 0:
		c.hooks[1] = h
	default:
		c.more = append(c.more, h)
	}
	c.mu.Unlock()
	return id
}

// StopHook unregisters the hook id; false means it already ran (or was
// started) or was stopped before.
func (c *reqCtx) StopHook(id uint64) bool {
	if id == 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := range c.hooks {
		if c.hooks[i].id == id {
			c.hooks[i] = ctxHook{}
			return true
		}
	}
	for i := range c.more {
		if c.more[i].id == id {
			c.more = append(c.more[:i], c.more[i+1:]...)
			return true
		}
	}
	return false
}

// AfterFunc is context.AfterFunc's contract (the context package calls it
// for contexts derived from this one).
func (c *reqCtx) AfterFunc(f func()) (stop func() bool) {
	id := c.CancelHook(f)
	return func() bool { return c.StopHook(id) }
}
