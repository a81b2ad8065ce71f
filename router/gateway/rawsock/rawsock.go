// Package rawsock reads and writes TCP connections with non-blocking system
// calls made directly (syscall.RawSyscall), waiting for readiness in Go's
// netpoller through syscall.RawConn.
//
// Why: at a few thousand SSE events per second spread over idle gaps, every
// read and write through net.Conn entered the runtime's syscall state, and
// the first one after an idle moment woke the runtime's monitor thread
// (sysmon), which then polled at 20 µs for a while (a futex wake, a
// nanosleep and two context switches of that thread per idle moment).
//
// Only *net.TCPConn (and *net.UnixConn) on Linux are wrapped; anything else
// is returned unchanged.
package rawsock

import (
	"errors"
	"io"
	"net"
	"os"
	"sync/atomic"
	"syscall"
)

// Conn is a net.Conn whose Read and Write use raw system calls. Reads and
// writes may run concurrently with each other (as on any net.Conn), not
// with themselves.
type Conn struct {
	net.Conn
	rc syscall.RawConn

	// Arguments and results of the read and write callbacks, kept here so
	// that the callbacks (bound once) allocate nothing per call.
	rp      []byte
	rn      int
	rerr    error
	readFn  func(uintptr) bool
	wp      []byte
	wn      int
	werr    error
	writeFn func(uintptr) bool
	aw      interface{ Flush() error } // WriteThenAwaitRead's state
	awFirst bool
	awErr   error
	awaitFn func(uintptr) bool
	rlBuf   []byte // RelayTo's state
	rlSink  Sink
	rlErr   error
	relayFn func(uintptr) bool
	hold    func() bool // Hold's state
	holdFn  func(uintptr) bool
	hfd     uintptr // the descriptor, while a RawConn.Read holds it open
	holding bool    // inside Hold's fn: reads and writes are direct
	direct  bool    // inside WriteThenAwaitRead's flush: writes are direct
	drained bool
	closed  atomic.Bool // Close was called (Hold keeps the descriptor open)
}

// ErrWouldBlock is what Read returns inside Hold when nothing is there to
// read yet.
var ErrWouldBlock = errors.New("rawsock: read would block")

// Sink receives what RelayTo reads.
type Sink interface {
	// Feed takes one read's bytes; done or an error ends the relay.
	Feed(p []byte) (done bool, err error)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(p []byte) (done bool, err error)

// Feed calls f.
func (f SinkFunc) Feed(p []byte) (bool, error) { return f(p) }

type syscallConn interface {
	SyscallConn() (syscall.RawConn, error)
}

// Wrap returns c as a *Conn where raw I/O is supported, c itself otherwise.
func Wrap(c net.Conn) net.Conn {
	if !supported {
		return c
	}
	switch c.(type) {
	case *net.TCPConn, *net.UnixConn:
	default:
		return c
	}
	rc, err := c.(syscallConn).SyscallConn()
	if err != nil {
		return c
	}
	rw := &Conn{Conn: c, rc: rc}
	rw.readFn, rw.writeFn = rw.doRead, rw.doWrite
	return rw
}

// Read reads as net.Conn's Read does.
func (c *Conn) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.rp, c.rn, c.rerr = p, 0, nil
	var err error
	if c.holding {
		// One system call, never a wait: Hold's fn waits by returning.
		if !c.doRead(c.hfd) {
			err = ErrWouldBlock
		}
	} else {
		err = c.rc.Read(c.readFn)
	}
	n, rerr := c.rn, c.rerr
	c.rp, c.rerr = nil, nil
	if err != nil {
		return n, err
	}
	return n, rerr
}

// doRead reads once into c.rp. It also notes, for Drained, whether the
// socket had nothing more: an empty socket (EAGAIN) or a short read.
func (c *Conn) doRead(fd uintptr) bool {
	for {
		n, e := read(fd, c.rp)
		switch e {
		case 0:
			c.rn, c.drained = n, n < len(c.rp)
			if n == 0 {
				c.rerr = io.EOF
			}
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			c.drained = true
			return false
		default:
			c.rerr = os.NewSyscallError("read", e)
			return true
		}
	}
}

// Write writes all of p unless an error occurs, as net.Conn's Write does.
// Inside Hold (from fn, or a goroutine fn waits for) and WriteThenAwaitRead
// it writes directly, the descriptor being held open, and waits through
// RawConn.Write only when the socket is full.
func (c *Conn) Write(p []byte) (int, error) {
	c.wp, c.wn, c.werr = p, 0, nil
	var err error
	switch {
	case (c.holding || c.direct) && c.closed.Load():
		err = net.ErrClosed
	case (c.holding || c.direct) && c.doWrite(c.hfd):
	default:
		// Waits while the socket is full, then goes on from where a direct
		// write stopped.
		err = c.rc.Write(c.writeFn)
	}
	n, werr := c.wn, c.werr
	c.wp, c.werr = nil, nil
	if err != nil {
		return n, err
	}
	return n, werr
}

// Close closes the connection. Inside Hold the descriptor stays open until
// Hold returns, but Write fails at once, as after any close.
func (c *Conn) Close() error {
	c.closed.Store(true)
	return c.Conn.Close()
}

func (c *Conn) doWrite(fd uintptr) bool {
	for len(c.wp) > 0 {
		n, e := write(fd, c.wp)
		switch e {
		case 0:
			c.wn += n
			c.wp = c.wp[n:]
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werr = os.NewSyscallError("write", e)
			return true
		}
	}
	return true
}

// CloseWrite shuts down the writing side, where the wrapped conn can.
func (c *Conn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

// Relay reads into buf until fn says it is done or fails, calling fn with
// the bytes of each read, inside one RawConn.Read (no per-read locking and
// poll reset). A read deadline (or closing the connection) interrupts the
// wait. A peer's close is io.EOF.
//
// It reads until EAGAIN before waiting, like net.Conn. Waiting right after
// a read that did not fill buf (as nginx does, knowing EPOLLRDHUP) saved 3
// of 25 system calls per streamed request but no measurable CPU, and loses
// a FIN that arrived with the last bytes: the stream would hang instead of
// ending.
//
// fn runs on the calling goroutine and may block (e.g. writing elsewhere).
// Nothing may read c concurrently.
func (c *Conn) Relay(buf []byte, fn func(p []byte) (done bool, err error)) error {
	return c.RelayTo(buf, SinkFunc(fn))
}

// RelayTo is Relay feeding s, with its state kept on c: no closure is
// allocated per call.
func (c *Conn) RelayTo(buf []byte, s Sink) error {
	if len(buf) == 0 {
		return io.ErrShortBuffer
	}
	c.rlBuf, c.rlSink, c.rlErr = buf, s, nil
	if c.relayFn == nil {
		c.relayFn = c.doRelay // bound once
	}
	err := c.rc.Read(c.relayFn)
	ferr := c.rlErr
	c.rlBuf, c.rlSink, c.rlErr = nil, nil, nil
	if err != nil {
		return err
	}
	return ferr
}

func (c *Conn) doRelay(fd uintptr) bool {
	buf := c.rlBuf
	for {
		n, e := read(fd, buf)
		switch e {
		case 0:
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			c.rlErr = os.NewSyscallError("read", e)
			return true
		}
		if n == 0 {
			c.rlErr = io.EOF
			return true
		}
		done, err := c.rlSink.Feed(buf[:n])
		if done || err != nil {
			c.rlErr = err
			return true
		}
	}
}

// WriteThenAwaitRead flushes w (which writes to c, e.g. a request), then
// waits until c is readable (e.g. its response began), without the read
// that would only see EAGAIN. The wait is armed before the flush, so bytes
// arriving during or after it are not missed. A deadline or closing c
// interrupts the wait; the flush's error is returned as is.
func (c *Conn) WriteThenAwaitRead(w interface{ Flush() error }) error {
	c.aw, c.awFirst, c.awErr = w, true, nil
	if c.awaitFn == nil {
		c.awaitFn = c.doAwait // bound once: no allocation per call
	}
	err := c.rc.Read(c.awaitFn)
	werr := c.awErr
	c.aw, c.awErr = nil, nil
	if werr != nil {
		return werr
	}
	return err
}

func (c *Conn) doAwait(fd uintptr) bool {
	if c.awFirst {
		c.awFirst = false
		c.hfd, c.direct = fd, true
		c.awErr = c.aw.Flush()
		c.direct = false
		return c.awErr != nil
	}
	return true
}

// Hold calls fn inside one RawConn.Read, repeatedly: fn returns true when it
// is done, false to wait until c is readable, and is called again then. While
// fn runs, Read on c makes one system call and returns ErrWouldBlock instead
// of waiting.
//
// Why: every RawConn.Read (so every net.Conn Read) starts by resetting the
// netpoller's record that c became readable, so a server that waits for a
// keep-alive connection's next request must first read, see EAGAIN, and only
// then wait: one futile system call per request. Within one RawConn.Read
// nothing resets that record between waits, so fn may return false without
// that read, once Drained says the socket had nothing more: data that came
// while fn ran (e.g. while it handled a request) ends the wait at once.
//
// fn must not close c: Close waits until fn has returned (CloseWrite is
// fine), which also means that closing c from another goroutine waits until
// fn returns or waits. Only fn's goroutine may read c meanwhile.
func (c *Conn) Hold(fn func() (done bool)) error {
	c.hold = fn
	if c.holdFn == nil {
		c.holdFn = c.doHold // bound once
	}
	err := c.rc.Read(c.holdFn)
	c.hold, c.holding = nil, false
	return err
}

func (c *Conn) doHold(fd uintptr) bool {
	// Called first or after a wait: what is readable is unknown.
	c.hfd, c.holding, c.drained = fd, true, false
	done := c.hold()
	c.holding = false
	return done
}

// Drained reports, inside Hold, whether the last read since fn was called
// found the socket empty (EAGAIN) or returned less than asked for: anything
// arriving later ends Hold's next wait at once, so fn may return false
// without reading first.
func (c *Conn) Drained() bool { return c.holding && c.drained }

// SyscallConn returns the wrapped connection's raw conn.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }
