// Package testutil holds what Oasis's tests share: free loopback ports,
// commands of this module built for a test binary, real processes started
// and stopped with a test (oasis-sim and Consul agents among them), and
// waiting for a condition.
//
// Free ports (FreePorts, FreePort, FreeAddr, RefusingAddr) come
// from 10000-19999, below the kernel's ephemeral range, so that no outgoing
// connection on the machine takes one between the moment it is found free
// and the moment the process it went to binds it. Each test process claims
// a window of 100 of those ports that no other process on the machine holds
// (PortWindows: a flock'ed lock file per window in LockDir, released when
// the process ends) and hands them out in turn, skipping a port something
// else has bound; only when all 100 windows are held does it fall back to
// ephemeral ports, and it says so on standard error. The test bed's windows
// of Nomad dynamic ports are claimed the same way (test/e2e/testbed).
package testutil

import (
	"bytes"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// FreePorts returns n distinct ports on 127.0.0.1 that were free for TCP
// and UDP a moment ago, from this process's window (the package comment).
// n is at most 100.
func FreePorts(n int) ([]int, error) {
	a, err := processPorts()
	if err != nil {
		return nil, err
	}
	return a.Ports(n)
}

// FreePort returns a port on 127.0.0.1 that was free a moment ago, and
// fails the test if there is none.
func FreePort(t testing.TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	must.NoError(t, err)
	return ports[0]
}

// FreeAddr returns FreePort's port as an address, 127.0.0.1:port, for a TCP
// or a UDP (QUIC) listener.
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
