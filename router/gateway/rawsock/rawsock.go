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
	"io"
	"net"
	"os"
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
}

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
	err := c.rc.Read(c.readFn)
	n, rerr := c.rn, c.rerr
	c.rp, c.rerr = nil, nil
	if err != nil {
		return n, err
	}
	return n, rerr
}

func (c *Conn) doRead(fd uintptr) bool {
	for {
		n, e := read(fd, c.rp)
		switch e {
		case 0:
			c.rn = n
			if n == 0 {
				c.rerr = io.EOF
			}
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		default:
			c.rerr = os.NewSyscallError("read", e)
			return true
		}
	}
}

// Write writes all of p unless an error occurs, as net.Conn's Write does.
func (c *Conn) Write(p []byte) (int, error) {
	c.wp, c.wn, c.werr = p, 0, nil
	err := c.rc.Write(c.writeFn)
	n, werr := c.wn, c.werr
	c.wp, c.werr = nil, nil
	if err != nil {
		return n, err
	}
	return n, werr
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

func (c *Conn) doAwait(uintptr) bool {
	if c.awFirst {
		c.awFirst = false
		c.awErr = c.aw.Flush()
		return c.awErr != nil
	}
	return true
}

// SyscallConn returns the wrapped connection's raw conn.
func (c *Conn) SyscallConn() (syscall.RawConn, error) { return c.rc, nil }
