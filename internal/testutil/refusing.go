package testutil

import (
	"errors"
	"net"
	"strconv"
	"sync"
	"syscall"
	"testing"

	"github.com/shoenig/test/must"
)

// RefusingAddr returns a loopback address where connections are refused
// until release is called or the test ends. A socket holds the port, bound
// but never listening: no server can take the port meanwhile, neither one
// of the test's own (an httptest engine, the router under test) nor another
// process's, as any can take a port that was only free a moment ago
// (FreeAddr), which then answers for the "dead" address. The port is one of
// FreePort's, outside the kernel's ephemeral range, so release frees it for
// a test that later listens on it itself.
func RefusingAddr(t testing.TB) (addr string, release func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	must.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = syscall.Close(fd) }) }
	t.Cleanup(release)
	// This bind, without SO_REUSEADDR (with it a listener could share the
	// port), fails where FreePort's check, a listener's bind, succeeds: on a
	// port with connections in TIME_WAIT, which a window the process has
	// already gone round holds for a minute. Take the next port then.
	const attempts = 32
	for attempt := 1; ; attempt++ {
		port := FreePort(t)
		err = syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
		if err == nil {
			return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), release
		}
		if attempt == attempts || !errors.Is(err, syscall.EADDRINUSE) {
			t.Fatalf("binding a refusing socket to 127.0.0.1:%d: %v", port, err)
		}
	}
}
