package testutil

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// ephemeralRange is the kernel's range of ports for outgoing connections.
func ephemeralRange(t *testing.T) (lo, hi int) {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	must.NoError(t, err)
	_, err = fmt.Sscan(string(b), &lo, &hi)
	must.NoError(t, err)
	return lo, hi
}

func TestFreePortsAreDistinctAndOutsideTheEphemeralRange(t *testing.T) {
	lo, hi := ephemeralRange(t)
	if lo <= testPortsMin+testPortsWidth*testPortsWindows-1 && hi >= testPortsMin {
		t.Skipf("this machine's ephemeral ports (%d-%d) overlap the test ports: outgoing connections can take them", lo, hi)
	}
	seen := map[int]bool{}
	for range 3 {
		ports, err := FreePorts(8)
		must.NoError(t, err)
		for _, p := range ports {
			must.Between(t, testPortsMin, p, testPortsMin+testPortsWidth*testPortsWindows-1)
			must.False(t, p >= lo && p <= hi, must.Sprintf("port %d is ephemeral (%d-%d)", p, lo, hi))
			must.False(t, seen[p], must.Sprintf("port %d handed out twice", p))
			seen[p] = true
		}
	}
	for _, fixed := range []string{FreeAddr(t), func() string { a, _ := RefusingAddr(t); return a }()} {
		_, port, err := net.SplitHostPort(fixed)
		must.NoError(t, err)
		p, _ := strconv.Atoi(port)
		must.Between(t, testPortsMin, p, testPortsMin+testPortsWidth*testPortsWindows-1)
	}
}

// noListeners stands in for Listeners where a test claims windows of
// ports other test processes may listen on: it tests the lock files alone.
func noListeners(int, int) ([]Listener, error) { return nil, nil }

// ownWindows carves windows out of a real window this test holds, with
// their lock files in a directory of the test's own: their ports are this
// test's alone, whatever other test processes run.
func ownWindows(t *testing.T, width, count int) PortWindows {
	t.Helper()
	real, err := TestPortWindows().Claim()
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, real.Release()) })
	must.LessEq(t, real.Max-real.Min+1, width*count)
	return PortWindows{Name: "own", Min: real.Min, Width: width, Count: count, Dir: t.TempDir()}
}

// A second claimer in this process gets a window of its own, and hands out
// its ports in turn, skipping one a TCP listener or a UDP socket holds.
func TestPortAllocatorSkipsATakenPort(t *testing.T) {
	_, err := FreePorts(1) // the process's own allocator holds a window now
	must.NoError(t, err)
	mine, err := processPorts()
	must.NoError(t, err)
	a, err := NewPortAllocator(TestPortWindows(), t.Logf)
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, a.Close()) })
	first, err := a.Ports(1)
	must.NoError(t, err)
	must.NotEq(t, mine.Window().Min, a.Window().Min)
	must.Eq(t, a.Window().Min, first[0])

	tcp, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(first[0]+1)))
	must.NoError(t, err)
	defer tcp.Close()
	udp, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(first[0]+3)))
	must.NoError(t, err)
	defer udp.Close()
	next, err := a.Ports(2)
	must.NoError(t, err)
	must.Eq(t, []int{first[0] + 2, first[0] + 4}, next)
}

// At the window's end the allocator starts over, still skipping what is
// bound, and says so when the window has fewer free ports than asked for.
func TestPortAllocatorWrapsAround(t *testing.T) {
	w := ownWindows(t, 3, 1)
	a, err := NewPortAllocator(w, t.Logf)
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, a.Close()) })
	m := w.Min
	for _, want := range [][]int{{m, m + 1}, {m + 2, m}} {
		got, err := a.Ports(2)
		must.NoError(t, err)
		must.Eq(t, want, got)
	}
	held, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(m+1)))
	must.NoError(t, err)
	defer held.Close()
	got, err := a.Ports(2)
	must.NoError(t, err)
	must.Eq(t, []int{m + 2, m}, got)
	_, err = a.Ports(3)
	must.ErrorContains(t, err, "only 2 of the 3 ports")
}

// With every window held the allocator hands out ephemeral ports and says
// so once; a window released later is taken at the next call.
func TestPortAllocatorFallsBackWhenEveryWindowIsHeld(t *testing.T) {
	w := ownWindows(t, 10, 2)
	held := make([]*PortWindow, 2)
	for i := range held {
		var err error
		held[i], err = w.Claim()
		must.NoError(t, err)
		defer held[i].Release()
	}
	_, err := w.Claim()
	must.ErrorIs(t, err, ErrNoPortWindow)

	var logged []string
	a, err := NewPortAllocator(w, func(format string, args ...any) { logged = append(logged, fmt.Sprintf(format, args...)) })
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, a.Close()) })
	lo, hi := ephemeralRange(t)
	for range 2 {
		ports, err := a.Ports(3)
		must.NoError(t, err)
		for _, p := range ports {
			must.Between(t, lo, p, hi)
		}
	}
	must.Len(t, 1, logged)
	must.StrContains(t, logged[0], ErrNoPortWindow.Error())
	must.StrContains(t, logged[0], "ephemeral")

	must.NoError(t, held[1].Release())
	ports, err := a.Ports(1)
	must.NoError(t, err)
	must.Eq(t, []int{held[1].Min}, ports)
}

func TestPortWindowsRefuseBadConfigs(t *testing.T) {
	cases := map[string]struct {
		w    PortWindows
		want string
	}{
		"no name":        {PortWindows{Min: 10000, Width: 10, Count: 1}, "Name"},
		"name with path": {PortWindows{Name: "../x", Min: 10000, Width: 10, Count: 1}, "Name"},
		"zero width":     {PortWindows{Name: "x", Min: 10000, Count: 1}, "Width"},
		"no windows":     {PortWindows{Name: "x", Min: 10000, Width: 10}, "Count"},
		"past 65535":     {PortWindows{Name: "x", Min: 65000, Width: 100, Count: 6}, "not a port range"},
		"port zero":      {PortWindows{Name: "x", Width: 100, Count: 6}, "not a port range"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := NewPortAllocator(tc.w, nil)
			must.ErrorContains(t, err, tc.want)
			_, err = tc.w.Claim()
			must.ErrorContains(t, err, tc.want)
		})
	}
	a, err := NewPortAllocator(PortWindows{Name: "x", Min: 10000, Width: 10, Count: 1, Dir: t.TempDir()}, nil)
	must.NoError(t, err)
	for _, n := range []int{0, 11} {
		_, err = a.Ports(n)
		must.ErrorContains(t, err, "between 1 and 10")
	}
}

const claimHelperEnv = "OASIS_TESTUTIL_CLAIM_HELPER"

// TestClaimHelper is the other process of
// TestPortWindowsAreDisjointAcrossProcesses: it claims a window, prints it,
// and holds it until its standard input closes.
func TestClaimHelper(t *testing.T) {
	dir := os.Getenv(claimHelperEnv)
	if dir == "" {
		t.Skip("run by TestPortWindowsAreDisjointAcrossProcesses")
	}
	w, err := PortWindows{Name: "cross", Min: 10000, Width: 100, Count: 3, Dir: dir, Listening: noListeners}.Claim()
	must.NoError(t, err)
	fmt.Printf("claimed %d %d\n", w.Min, w.Max)
	_, _ = io.Copy(io.Discard, os.Stdin)
}

func TestPortWindowsAreDisjointAcrossProcesses(t *testing.T) {
	windows := PortWindows{Name: "cross", Min: 10000, Width: 100, Count: 3, Dir: t.TempDir(), Listening: noListeners}
	cmd := exec.Command(os.Args[0], "-test.run=^TestClaimHelper$")
	cmd.Env = append(os.Environ(), claimHelperEnv+"="+windows.Dir)
	stdin, err := cmd.StdinPipe()
	must.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	must.NoError(t, err)
	must.NoError(t, cmd.Start())
	t.Cleanup(func() { stdin.Close(); _ = cmd.Wait() })
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "claimed ") {
				lines <- sc.Text()
			}
		}
		close(lines)
	}()
	var other PortWindow
	select {
	case line := <-lines:
		_, err := fmt.Sscanf(line, "claimed %d %d", &other.Min, &other.Max)
		must.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("the helper process did not claim a window")
	}
	must.Eq(t, PortWindow{Min: 10000, Max: 10099}, other)

	a, err := windows.Claim()
	must.NoError(t, err)
	defer a.Release()
	b, err := windows.Claim()
	must.NoError(t, err)
	defer b.Release()
	for _, w := range []*PortWindow{a, b} {
		must.True(t, w.Max < other.Min || w.Min > other.Max, must.Sprintf("%d-%d overlaps the helper's %d-%d", w.Min, w.Max, other.Min, other.Max))
	}
	must.NotEq(t, a.Min, b.Min)
	_, err = windows.Claim()
	must.ErrorIs(t, err, ErrNoPortWindow)

	// The helper's window is free again once it has exited, though it never
	// released it itself.
	stdin.Close()
	must.NoError(t, cmd.Wait())
	c, err := windows.Claim()
	must.NoError(t, err)
	defer c.Release()
	must.Eq(t, other.Min, c.Min)
}

// OASIS_TEST_LOCK_DIR moves the lock files: what a test that runs a process
// with a TMPDIR of its own passes on, so that its windows stay disjoint
// from every other process's.
func TestLockDirEnvMovesTheLockFiles(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(LockDirEnv, dir)
	must.Eq(t, dir, LockDir())
	w, err := PortWindows{Name: "moved", Min: 10000, Width: 10, Count: 1, Listening: noListeners}.Claim()
	must.NoError(t, err)
	defer w.Release()
	_, err = os.Stat(filepath.Join(dir, "oasis-moved-0.lock"))
	must.NoError(t, err)
	_, err = PortWindows{Name: "moved", Min: 10000, Width: 10, Count: 1, Dir: dir, Listening: noListeners}.Claim()
	must.ErrorIs(t, err, ErrNoPortWindow)
}

// A window a socket listens in is passed over, whoever listens: a process
// an earlier holder left behind would meet every port handed out there.
func TestClaimPassesOverAWindowWithAListener(t *testing.T) {
	w := ownWindows(t, 5, 2)
	left, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(w.Min+2)))
	must.NoError(t, err)
	got, err := w.Claim()
	must.NoError(t, err)
	must.Eq(t, w.Min+5, got.Min)
	must.NoError(t, got.Release())

	other, err := net.Listen("tcp6", net.JoinHostPort("::1", strconv.Itoa(w.Min+9)))
	if err == nil { // IPv6 listeners count as much as IPv4 ones
		_, err = w.Claim()
		must.ErrorIs(t, err, ErrNoPortWindow)
		must.ErrorContains(t, err, fmt.Sprintf("ports [%d] of the window %d-%d are listened on", w.Min+2, w.Min, w.Min+4))
		must.NoError(t, other.Close())
	}
	must.NoError(t, left.Close())
	got, err = w.Claim()
	must.NoError(t, err)
	must.Eq(t, w.Min, got.Min)
	must.NoError(t, got.Release())
}

func TestListenersFindAListenerAndItsProcess(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer l.Close()
	p := l.Addr().(*net.TCPAddr).Port
	ls, err := Listeners(p, p)
	must.NoError(t, err)
	must.Len(t, 1, ls)
	must.Eq(t, []int{p}, listenerPorts(ls))
	desc := DescribeListeners(ls)
	must.StrHasPrefix(t, fmt.Sprintf("%d (pid %d: %s", p, os.Getpid(), os.Args[0]), desc[0])
}

func TestListenersIn(t *testing.T) {
	const header = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"
	for name, tc := range map[string]struct {
		table   string
		want    []Listener
		wantErr string
	}{
		"listeners in range, others not": {table: header +
			"   0: 0100007F:2710 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 11 1 0000000000000000 100 0 0 10 0\n" +
			"   1: 0100007F:4E20 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 12 1 0000000000000000 20 4 0 10 -1\n" +
			"   2: 00000000:4E21 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 13 1 0000000000000000 100 0 0 10 0\n",
			want: []Listener{{Port: 20001, Inode: 13}}},
		"IPv6": {table: header +
			"   0: 00000000000000000000000001000000:4E22 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 14 1 0000000000000000 100 0 0 10 0\n",
			want: []Listener{{Port: 20002, Inode: 14}}},
		"header only":        {table: header},
		"short line ignored": {table: header + "   0: 0100007F:4E20 00000000:0000 0A\n"},
		"no port":            {table: header + "   0: 0100007F 00000000:0000 0A 0:0 0:0 0 0 0 15\n", wantErr: "has no port"},
		"bad port":           {table: header + "   0: 0100007F:XYZ 00000000:0000 0A 0:0 0:0 0 0 0 15\n", wantErr: "XYZ"},
		"bad inode":          {table: header + "   0: 0100007F:4E20 00000000:0000 0A 0:0 0:0 0 0 0 x\n", wantErr: "inode"},
	} {
		t.Run(name, func(t *testing.T) {
			got, err := listenersIn(strings.NewReader(tc.table), 20000, 20009)
			if tc.wantErr != "" {
				must.ErrorContains(t, err, tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
}
