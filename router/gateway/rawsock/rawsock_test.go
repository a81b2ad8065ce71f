package rawsock

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// pair returns a wrapped server-side conn and the plain client side.
func pair(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	must.NoError(t, err)
	s, err := ln.Accept()
	must.NoError(t, err)
	w, ok := Wrap(s).(*Conn)
	if !supported {
		must.False(t, ok)
		t.Skip("raw socket I/O is Linux only")
	}
	must.True(t, ok)
	t.Cleanup(func() { w.Close(); client.Close() })
	return w, client
}

func TestWrapLeavesOtherConnsAlone(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	must.Eq(t, a, Wrap(a))
}

func TestReadWrite(t *testing.T) {
	c, peer := pair(t)
	go func() {
		time.Sleep(20 * time.Millisecond) // the read waits for it
		_, _ = peer.Write([]byte("hello"))
	}()
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	must.NoError(t, err)
	must.Eq(t, "hello", string(buf[:n]))

	big := make([]byte, 8<<20) // more than the socket buffers: Write must wait for the reader
	for i := range big {
		big[i] = byte(i)
	}
	got := make(chan []byte)
	go func() { b, _ := io.ReadAll(peer); peer.Close(); got <- b }()
	n, err = c.Write(big)
	must.NoError(t, err)
	must.Eq(t, len(big), n)
	must.NoError(t, c.CloseWrite())
	must.True(t, bytes.Equal(big, <-got))

	n, err = c.Read(buf) // the peer's close
	must.Eq(t, 0, n)
	must.ErrorIs(t, err, io.EOF)
}

func TestRelay(t *testing.T) {
	c, peer := pair(t)
	go func() {
		for _, s := range []string{"one", "two", "three"} {
			time.Sleep(10 * time.Millisecond) // each its own read, after a short one
			_, _ = peer.Write([]byte(s))
		}
	}()
	var got []string
	err := c.Relay(make([]byte, 64), func(p []byte) (bool, error) {
		got = append(got, string(p))
		return len(got) == 3, nil
	})
	must.NoError(t, err)
	must.Eq(t, []string{"one", "two", "three"}, got)

	// A read that fills the buffer is followed by another read at once.
	_, err = peer.Write([]byte("abcdefgh"))
	must.NoError(t, err)
	got = nil
	total := 0
	err = c.Relay(make([]byte, 3), func(p []byte) (bool, error) {
		got = append(got, string(p))
		total += len(p)
		return total == 8, nil
	})
	must.NoError(t, err)
	must.Eq(t, "abcdefgh", join(got))

	// fn's error ends the relay.
	boom := errors.New("boom")
	_, _ = peer.Write([]byte("x"))
	err = c.Relay(make([]byte, 8), func([]byte) (bool, error) { return false, boom })
	must.ErrorIs(t, err, boom)
}

func TestRelayInterrupted(t *testing.T) {
	c, peer := pair(t)
	// A past deadline interrupts the wait (the transport's cancellation).
	go func() {
		time.Sleep(20 * time.Millisecond)
		_ = c.SetReadDeadline(time.Unix(1, 0))
	}()
	err := c.Relay(make([]byte, 8), func([]byte) (bool, error) { return false, nil })
	must.ErrorIs(t, err, os.ErrDeadlineExceeded)
	must.NoError(t, c.SetReadDeadline(time.Time{}))

	// The peer's close is io.EOF, after the bytes sent before it.
	_, _ = peer.Write([]byte("last"))
	peer.Close()
	var got []string
	err = c.Relay(make([]byte, 8), func(p []byte) (bool, error) { got = append(got, string(p)); return false, nil })
	must.ErrorIs(t, err, io.EOF)
	must.Eq(t, "last", join(got))
}

func TestRelayClosed(t *testing.T) {
	c, _ := pair(t)
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Close()
	}()
	err := c.Relay(make([]byte, 8), func([]byte) (bool, error) { return false, nil })
	must.ErrorIs(t, err, net.ErrClosed)
}

func join(s []string) string {
	var out string
	for _, x := range s {
		out += x
	}
	return out
}

func TestWriteThenAwaitRead(t *testing.T) {
	c, peer := pair(t)
	go func() {
		b := make([]byte, 4)
		_, _ = io.ReadFull(peer, b)
		time.Sleep(20 * time.Millisecond) // the wait must last until the answer
		_, _ = peer.Write(b)
	}()
	must.NoError(t, c.WriteThenAwaitRead(flushFunc(func() error { _, err := c.Write([]byte("ping")); return err })))
	buf := make([]byte, 8)
	n, err := c.Read(buf)
	must.NoError(t, err)
	must.Eq(t, "ping", string(buf[:n]))

	// An answer that came at once (during the write) is not missed.
	go func() { _, _ = io.Copy(peer, peer) }()
	must.NoError(t, c.WriteThenAwaitRead(flushFunc(func() error { _, err := c.Write([]byte("echo")); return err })))
	n, err = c.Read(buf)
	must.NoError(t, err)
	must.Eq(t, "echo", string(buf[:n]))

	boom := errors.New("boom")
	must.ErrorIs(t, c.WriteThenAwaitRead(flushFunc(func() error { return boom })), boom)

	// A deadline interrupts the wait.
	must.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	err = c.WriteThenAwaitRead(flushFunc(func() error { return nil }))
	must.ErrorIs(t, err, os.ErrDeadlineExceeded)
}

type flushFunc func() error

func (f flushFunc) Flush() error { return f() }

func TestHold(t *testing.T) {
	c, peer := pair(t)
	must.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second))) // a lost wakeup fails, not hangs
	buf := make([]byte, 16)
	calls := 0
	err := c.Hold(func() bool {
		calls++
		switch calls {
		case 1:
			// Nothing yet: Read does not wait.
			must.False(t, c.Drained())
			_, err := c.Read(buf)
			must.ErrorIs(t, err, ErrWouldBlock)
			must.True(t, c.Drained())
			// Bytes arriving now, with no read after them, end the wait
			// that returning false starts.
			_, err = peer.Write([]byte("ab"))
			must.NoError(t, err)
			return false
		case 2:
			must.False(t, c.Drained()) // after a wait: unknown
			n, err := c.Read(buf)
			must.NoError(t, err)
			must.Eq(t, "ab", string(buf[:n]))
			must.True(t, c.Drained()) // a short read
			_, err = peer.Write([]byte("cdef"))
			must.NoError(t, err)
			n, err = c.Read(buf[:2]) // a full one: more may be there
			must.NoError(t, err)
			must.Eq(t, "cd", string(buf[:n]))
			must.False(t, c.Drained())
			return false // the stale readiness of "cdef" ends the wait
		default:
			n, err := c.Read(buf)
			must.NoError(t, err)
			must.Eq(t, "ef", string(buf[:n]))
			return true
		}
	})
	must.NoError(t, err)
	must.Eq(t, 3, calls)
	must.False(t, c.Drained()) // outside Hold

	// After Hold, Read waits again as usual.
	go func() {
		time.Sleep(20 * time.Millisecond)
		_, _ = peer.Write([]byte("later"))
	}()
	n, err := c.Read(buf)
	must.NoError(t, err)
	must.Eq(t, "later", string(buf[:n]))

	// The peer's close is io.EOF inside Hold too.
	peer.Close()
	err = c.Hold(func() bool {
		_, err := c.Read(buf)
		if errors.Is(err, ErrWouldBlock) {
			return false
		}
		must.ErrorIs(t, err, io.EOF)
		return true
	})
	must.NoError(t, err)
}

func TestHoldInterrupted(t *testing.T) {
	c, _ := pair(t)
	wait := func() bool {
		_, err := c.Read(make([]byte, 8))
		must.ErrorIs(t, err, ErrWouldBlock)
		return false
	}
	// A deadline ends the wait.
	must.NoError(t, c.SetReadDeadline(time.Now().Add(20*time.Millisecond)))
	must.ErrorIs(t, c.Hold(wait), os.ErrDeadlineExceeded)
	must.NoError(t, c.SetReadDeadline(time.Time{}))
	// So does closing c from another goroutine.
	go func() {
		time.Sleep(20 * time.Millisecond)
		c.Close()
	}()
	must.ErrorIs(t, c.Hold(wait), net.ErrClosed)
}

func TestWriteInsideHold(t *testing.T) {
	c, peer := pair(t)
	big := make([]byte, 8<<20) // more than the socket buffers: the write must wait for the reader
	for i := range big {
		big[i] = byte(i)
	}
	got := make(chan []byte)
	go func() {
		b := make([]byte, 5+len(big))
		_, _ = io.ReadFull(peer, b)
		got <- b
	}()
	err := c.Hold(func() bool {
		n, err := c.Write([]byte("hello"))
		must.NoError(t, err)
		must.Eq(t, 5, n)
		n, err = c.Write(big)
		must.NoError(t, err)
		must.Eq(t, len(big), n)
		return true
	})
	must.NoError(t, err)
	b := <-got
	must.Eq(t, "hello", string(b[:5]))
	must.True(t, bytes.Equal(big, b[5:]))

	// Closed from elsewhere while fn runs: writes fail at once, and the
	// socket's close completes when fn returns.
	closed := make(chan struct{})
	err = c.Hold(func() bool {
		go func() { c.Close(); close(closed) }()
		must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
			_, err := c.Write([]byte("x"))
			return errors.Is(err, net.ErrClosed)
		}), wait.Timeout(5*time.Second)))
		select {
		case <-closed:
			t.Error("Close returned while fn still held the socket")
		default:
		}
		return true
	})
	must.NoError(t, err)
	<-closed
}

func TestWriteThenAwaitReadLargeFlush(t *testing.T) {
	c, peer := pair(t)
	big := make([]byte, 8<<20) // more than the socket buffers: the flush waits for the reader
	for i := range big {
		big[i] = byte(i)
	}
	go func() {
		b := make([]byte, len(big))
		_, _ = io.ReadFull(peer, b)
		if bytes.Equal(b, big) {
			_, _ = peer.Write([]byte("ok"))
		}
	}()
	must.NoError(t, c.WriteThenAwaitRead(flushFunc(func() error {
		n, err := c.Write(big)
		if err == nil && n != len(big) {
			err = io.ErrShortWrite
		}
		return err
	})))
	buf := make([]byte, 8)
	n, err := c.Read(buf)
	must.NoError(t, err)
	must.Eq(t, "ok", string(buf[:n]))
}
