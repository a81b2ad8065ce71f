package testutil

import (
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
// (FreeAddr), which then answers for the "dead" address. release frees the
// port, for a test that later listens on it itself.
func RefusingAddr(t testing.TB) (addr string, release func()) {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	must.NoError(t, err)
	var once sync.Once
	release = func() { once.Do(func() { _ = syscall.Close(fd) }) }
	t.Cleanup(release)
	must.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	must.NoError(t, err)
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(sa.(*syscall.SockaddrInet4).Port)), release
}
