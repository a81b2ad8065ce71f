package server

import (
	"container/list"
	"net"
	"sync"
)

// Memory of connections that have not authenticated (with a password set).
//
// Such a connection starts with small buffers (preAuthReadBuffer,
// preAuthWriteBuffer) and gets the full ones only once it authenticates.
// What it holds is charged to one allowance shared by every such connection
// (Config.UnauthenticatedBytes): preAuthConnBytes when it is accepted (its
// buffers, reader slab, goroutine stack and bookkeeping) and each argument
// of more than 64 bytes as its length is read. Its arguments do not take the
// in-flight budget, so clients without the password can neither hold nor
// wait for the bytes that authenticated clients' values need.
//
// A new connection that does not fit closes the oldest unauthenticated
// connections until it does (an attacker holding the allowance with slow
// connections is pushed out by every new client, which authenticates at
// once); an argument that does not fit closes its own connection with
// ErrUnauthenticatedMemory. The accounted bytes never exceed the allowance.
const (
	preAuthReadBuffer  = 4 << 10
	preAuthWriteBuffer = 512
	// preAuthConnBytes is what an unauthenticated connection holds before
	// its arguments: both buffers, the reader's 4 KiB slab for small
	// arguments, an 8 KiB goroutine stack and ~3 KiB of connection state.
	preAuthConnBytes = 20 << 10
	// connBuffer is the read and write buffer size of an authenticated
	// connection.
	connBuffer = 64 << 10
)

// preAuthPool is the allowance of unauthenticated connections.
type preAuthPool struct {
	limit int64
	mu    sync.Mutex
	used  int64
	conns list.List // *preAuthHold, oldest first
	// onEvict is called (under mu) for each connection closed to make room.
	onEvict func()
}

// preAuthHold is one connection's share of the pool. It implements
// resp.Allowance for the connection's reader.
type preAuthHold struct {
	p    *preAuthPool
	nc   net.Conn
	held int64
	elem *list.Element
	// ended: evicted or authenticated; its bytes are no longer counted and
	// it takes no more.
	ended   bool
	evicted bool
}

// admit charges a new connection's base bytes, closing the oldest
// unauthenticated connections while they do not fit; nil when the
// allowance is smaller than one connection.
func (p *preAuthPool) admit(nc net.Conn) *preAuthHold {
	p.mu.Lock()
	defer p.mu.Unlock()
	for p.used+preAuthConnBytes > p.limit && p.conns.Len() > 0 {
		old := p.conns.Front().Value.(*preAuthHold)
		old.endLocked()
		old.evicted = true
		old.nc.Close()
		if p.onEvict != nil {
			p.onEvict()
		}
	}
	if p.used+preAuthConnBytes > p.limit {
		return nil
	}
	h := &preAuthHold{p: p, nc: nc, held: preAuthConnBytes}
	p.used += preAuthConnBytes
	h.elem = p.conns.PushBack(h)
	return h
}

// detached returns a hold for a connection that authenticated and then
// dropped its authentication (RESET): its arguments are charged, but it is
// not charged a base nor closed to make room (its client knew the password).
func (p *preAuthPool) detached(nc net.Conn) *preAuthHold {
	return &preAuthHold{p: p, nc: nc}
}

// Take charges n more bytes of an argument if they fit.
func (h *preAuthHold) Take(n int64) bool {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if h.ended {
		return false
	}
	if h.p.used+n > h.p.limit {
		// The reader closes the connection: it holds nothing from now on,
		// and is not closed again to make room.
		h.endLocked()
		return false
	}
	h.held += n
	h.p.used += n
	return true
}

// Give returns n bytes taken with Take (nothing once the hold has ended,
// which returned them all).
func (h *preAuthHold) Give(n int64) {
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	if h.ended {
		return
	}
	n = min(n, h.held)
	h.held -= n
	h.p.used -= n
}

// end returns everything the connection holds: it authenticated or closed.
func (h *preAuthHold) end() {
	if h == nil {
		return
	}
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	h.endLocked()
}

func (h *preAuthHold) endLocked() {
	if h.ended {
		return
	}
	h.ended = true
	h.p.used -= h.held
	h.held = 0
	if h.elem != nil {
		h.p.conns.Remove(h.elem)
	}
}

// wasEvicted reports whether the connection was closed to make room.
func (h *preAuthHold) wasEvicted() bool {
	if h == nil {
		return false
	}
	h.p.mu.Lock()
	defer h.p.mu.Unlock()
	return h.evicted
}

// stats returns the bytes charged and the connections holding them.
func (p *preAuthPool) stats() (used int64, conns int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.used, p.conns.Len()
}
