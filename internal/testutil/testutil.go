// Package testutil holds what Oasis's tests share: free loopback ports,
// commands of this module built for a test binary, real processes started
// and stopped with a test (oasis-sim and Consul agents among them), and
// waiting for a condition.
package testutil

import (
	"bytes"
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// FreePorts reserves n distinct free TCP ports on 127.0.0.1. The listeners
// are closed before it returns, so a port can in principle be taken by
// someone else before it is used; holding all n until then at least keeps
// them distinct from each other.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	listeners := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserving a free port: %w", err)
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago, and
// fails the test if there is none.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	must.NoError(t, err)
	return ports[0]
}

// FreeAddr returns FreePort's port as an address, 127.0.0.1:port.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// Eventually fails the test unless cond returns true within timeout. It
// polls every 10 ms; what names the condition in the failure. It is how
// Oasis's tests wait: for a condition, never for a length of time.
func Eventually(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyEvery(t, timeout, 10*time.Millisecond, what, cond)
}

// EventuallyEvery is Eventually polling every gap: for a condition that
// costs a request to an agent, or that acts (publishes, sends a request)
// before it checks.
func EventuallyEvery(t testing.TB, timeout, gap time.Duration, what string, cond func() bool) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(cond), wait.Timeout(timeout), wait.Gap(gap)),
		must.Sprintf("timed out waiting for %s", what))
}

// SyncBuffer is a bytes.Buffer that several goroutines may write and read
// at once: a process's output copiers, or a plugin's log, and the test.
type SyncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *SyncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *SyncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
