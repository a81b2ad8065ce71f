//go:build linux

package h1

import (
	"errors"
	"os"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// hangups notices clients that close their connection while a handler
// runs, for every connection of a server at once: each connection's socket
// is in one epoll set for EPOLLRDHUP only (data arriving wakes nobody), and
// one goroutine waits on that set in the netpoller. The connection's own
// goroutine can then run its handlers itself: before, it handed each
// request to a second goroutine and waited on the socket meanwhile — a
// goroutine wakeup (and a futex wake of an idle thread) plus a read that
// returned EAGAIN per request.
type hangups struct {
	ep *os.File
	rc syscall.RawConn

	mu    sync.Mutex
	conns map[int32]*conn
	next  int32
}

func newHangups() (*hangups, error) {
	fd, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("setnonblock", err)
	}
	ep := os.NewFile(uintptr(fd), "h1-hangups") // non-blocking: waited on in the netpoller
	rc, err := ep.SyscallConn()
	if err != nil {
		ep.Close()
		return nil, err
	}
	return &hangups{ep: ep, rc: rc, conns: map[int32]*conn{}}, nil
}

// add watches cn's socket; false if it cannot be watched.
func (h *hangups) add(cn *conn) bool {
	sc, ok := cn.c.(interface {
		SyscallConn() (syscall.RawConn, error)
	})
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	cn.raw = rc
	h.mu.Lock()
	for {
		h.next++
		if _, used := h.conns[h.next]; !used {
			break
		}
	}
	id := h.next
	cn.hangupID = id
	h.conns[id] = cn
	h.mu.Unlock()
	var cerr error
	// Both descriptors are held open for the call (Control), whatever
	// closes them meanwhile.
	err = h.rc.Control(func(epfd uintptr) {
		cerr = rc.Control(func(fd uintptr) {
			// One report per connection is all it needs (EPOLLONESHOT).
			ev := syscall.EpollEvent{Events: syscall.EPOLLRDHUP | syscall.EPOLLONESHOT, Fd: id}
			cerr = syscall.EpollCtl(int(epfd), syscall.EPOLL_CTL_ADD, int(fd), &ev)
		})
	})
	if err == nil {
		err = cerr
	}
	if err != nil {
		h.mu.Lock()
		delete(h.conns, id)
		h.mu.Unlock()
		return false
	}
	return true
}

// remove forgets cn; closing its socket takes it out of the epoll set.
func (h *hangups) remove(cn *conn) {
	h.mu.Lock()
	delete(h.conns, cn.hangupID)
	h.mu.Unlock()
}

// run reports hangups until the set is closed.
func (h *hangups) run() {
	events := make([]syscall.EpollEvent, 64)
	epfd := 0
	_ = h.rc.Read(func(fd uintptr) bool {
		epfd = int(fd)
		for {
			n, err := syscall.EpollWait(epfd, events, 0)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return true
			}
			for _, ev := range events[:n] {
				h.mu.Lock()
				cn := h.conns[ev.Fd]
				h.mu.Unlock()
				if cn != nil {
					cn.hangup()
				}
			}
			if n < len(events) {
				return false // wait for the set to become readable again
			}
		}
	})
}

func (h *hangups) close() { h.ep.Close() }

// unread is how many bytes wait in the socket's receive queue.
func unread(rc syscall.RawConn) int {
	n := 0
	err := rc.Control(func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.SIOCINQ)
	})
	if err != nil {
		return 0
	}
	return n
}
