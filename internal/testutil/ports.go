package testutil

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
)

// Test ports come from 10000-19999, cut into 100 windows of 100: below the
// kernel's ephemeral range (32768-60999 by default), where any outgoing
// connection on the machine (a test's own HTTP clients, another package's
// agents) can take a port between the moment it was found free and the
// moment the process it was handed to binds it; below the test bed's windows
// of Nomad dynamic ports (20000-31999) and the drain and node tests' extra
// clients (61000-62999); clear of every default port Oasis never uses in a
// test (4646-4648, 6379, 8080, 8300-8302, 8500-8502, 8600). `go test` runs
// at most GOMAXPROCS package binaries at once (two for the e2e packages), so
// 100 windows are enough for a machine of up to 100 cores, and for two such
// runs on a 2-core machine.
const (
	testPortsMin     = 10000
	testPortsWidth   = 100
	testPortsWindows = 100
)

// LockDirEnv names the directory of the port windows' lock files, for a
// test that runs a process with a TMPDIR of its own; unset, it is the
// temporary directory this process started with.
const LockDirEnv = "OASIS_TEST_LOCK_DIR"

// startTempDir is os.TempDir as the process started: a TestMain that points
// TMPDIR elsewhere keeps claiming windows where every other test process does.
var startTempDir = os.TempDir()

// ErrNoPortWindow is the error when every window of a PortWindows is held
// by another process (or its lock file cannot be opened).
var ErrNoPortWindow = errors.New("every port window is held by another process")

// TestPortWindows are the windows FreePorts hands out ports from.
func TestPortWindows() PortWindows {
	return PortWindows{Name: "testutil-ports", Min: testPortsMin, Width: testPortsWidth, Count: testPortsWindows}
}

// PortWindows is a range of ports cut into Count windows of Width ports,
// Min first, which processes on one machine claim one at a time: the
// lock file of window i, oasis-<Name>-<i>.lock in Dir, is flock'ed by its
// holder until it releases the window or ends (the kernel drops the lock
// with the process), so no two processes hold the same window.
type PortWindows struct {
	// Name tells apart ranges that claim their windows independently.
	Name              string
	Min, Width, Count int
	// Dir holds the lock files: "" is LockDir().
	Dir string
	// Listening finds the sockets that listen on a port from lo to hi; nil
	// is Listeners.
	Listening func(lo, hi int) ([]Listener, error)
}

// PortWindow is a claimed window, ports Min to Max.
type PortWindow struct {
	Min, Max int
	lock     *os.File
}

// LockDir is where port windows' lock files live: $OASIS_TEST_LOCK_DIR, or
// the temporary directory the process started with.
func LockDir() string {
	if d := os.Getenv(LockDirEnv); d != "" {
		return d
	}
	return startTempDir
}

// Max is the range's last port.
func (w PortWindows) Max() int { return w.Min + w.Width*w.Count - 1 }

func (w PortWindows) validate() error {
	switch {
	case w.Name == "" || filepath.Base(w.Name) != w.Name:
		return fmt.Errorf("port windows: Name %q is not a file name", w.Name)
	case w.Width < 1 || w.Count < 1:
		return fmt.Errorf("port windows %s: Width %d and Count %d must be positive", w.Name, w.Width, w.Count)
	case w.Min < 1 || w.Max() > 65535:
		return fmt.Errorf("port windows %s: %d-%d is not a port range", w.Name, w.Min, w.Max())
	}
	return nil
}

// Claim takes the first window no other process holds and no socket
// listens in, or fails with ErrNoPortWindow. A listener in a free window is
// a process its last holder left behind (or a program outside the tests):
// the window is passed over, and the ports named on standard error, so that
// no port handed out meets it.
func (w PortWindows) Claim() (*PortWindow, error) {
	if err := w.validate(); err != nil {
		return nil, err
	}
	dir := w.Dir
	if dir == "" {
		dir = LockDir()
	}
	listening := w.Listening
	if listening == nil {
		listening = Listeners
	}
	var other error // why a window was not taken, other than its holder
	for i := range w.Count {
		f, err := flockFile(filepath.Join(dir, fmt.Sprintf("oasis-%s-%d.lock", w.Name, i)))
		if err != nil {
			if !errors.Is(err, syscall.EWOULDBLOCK) && other == nil {
				other = err
			}
			continue
		}
		lo := w.Min + i*w.Width
		hi := lo + w.Width - 1
		busy, err := listening(lo, hi)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("claiming a window of ports %d-%d: %w", lo, hi, err)
		}
		if len(busy) > 0 {
			f.Close()
			fmt.Fprintf(os.Stderr, "testutil: passing over the port window %d-%d of %s, listened on at %s\n",
				lo, hi, w.Name, strings.Join(DescribeListeners(busy), ", "))
			if other == nil {
				other = fmt.Errorf("ports %v of the window %d-%d are listened on", listenerPorts(busy), lo, hi)
			}
			continue
		}
		return &PortWindow{Min: lo, Max: hi, lock: f}, nil
	}
	if other != nil {
		return nil, fmt.Errorf("claiming a window of ports %d-%d: %w (and: %w)", w.Min, w.Max(), ErrNoPortWindow, other)
	}
	return nil, fmt.Errorf("claiming a window of ports %d-%d: %w", w.Min, w.Max(), ErrNoPortWindow)
}

// flockFile opens path, creating it if need be, and takes its exclusive
// lock without waiting (syscall.EWOULDBLOCK when another holds it). The
// file is opened read-only and created readable by all, so that processes
// of other users (a test re-executed as nobody) lock the same files.
func flockFile(path string) (*os.File, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		f, err = os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	}
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	return f, nil
}

// Release gives the window back to other processes.
func (w *PortWindow) Release() error {
	if w == nil || w.lock == nil {
		return nil
	}
	err := w.lock.Close()
	w.lock = nil
	return err
}

// PortAllocator hands out loopback ports from a window of its PortWindows,
// claimed at first use: in turn, starting over at the window's end, and
// skipping a port that a TCP or UDP bind on 127.0.0.1 shows taken (by a
// process the port went to earlier, or by a program outside the tests).
// When every window is held it hands out ephemeral ports, as FreePorts did
// before windows, and says so once through Logf.
type PortAllocator struct {
	windows PortWindows
	logf    func(format string, args ...any)

	mu     sync.Mutex
	win    *PortWindow
	next   int
	warned bool
}

// NewPortAllocator returns an allocator of windows; logf (nil: standard
// error) hears of a fallback to ephemeral ports.
func NewPortAllocator(windows PortWindows, logf func(format string, args ...any)) (*PortAllocator, error) {
	if err := windows.validate(); err != nil {
		return nil, err
	}
	if logf == nil {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, format+"\n", args...) }
	}
	return &PortAllocator{windows: windows, logf: logf}, nil
}

// Ports returns n distinct ports that were free on 127.0.0.1 a moment ago.
func (a *PortAllocator) Ports(n int) ([]int, error) {
	if n < 1 || n > a.windows.Width {
		return nil, fmt.Errorf("asked for %d ports: between 1 and %d at a time", n, a.windows.Width)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.win == nil {
		win, err := a.windows.Claim()
		if errors.Is(err, ErrNoPortWindow) {
			if !a.warned {
				a.warned = true
				a.logf("testutil: %v; handing out ephemeral ports, which an outgoing connection can take before they are bound", err)
			}
			return ephemeralPorts(n)
		}
		if err != nil {
			return nil, err
		}
		a.win, a.next = win, win.Min
	}
	ports := make([]int, 0, n)
	for tried := 0; tried < a.windows.Width && len(ports) < n; tried++ {
		p := a.next
		if a.next++; a.next > a.win.Max {
			a.next = a.win.Min
		}
		if portFree(p) {
			ports = append(ports, p)
		}
	}
	if len(ports) < n {
		return nil, fmt.Errorf("only %d of the %d ports asked for are free in the window %d-%d", len(ports), n, a.win.Min, a.win.Max)
	}
	return ports, nil
}

// Window is the claimed window, nil before the first Ports or while every
// window is held.
func (a *PortAllocator) Window() *PortWindow {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.win
}

// Close releases the window.
func (a *PortAllocator) Close() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	err := a.win.Release()
	a.win = nil
	return err
}

// portFree reports whether both a TCP and a UDP socket can bind port on
// 127.0.0.1 now.
func portFree(port int) bool {
	addr := net.JoinHostPort("127.0.0.1", fmt.Sprint(port))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	defer l.Close()
	c, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	return c.Close() == nil
}

// ephemeralPorts are n distinct ports the kernel picked from its ephemeral
// range that UDP can bind too; all stay bound until the last is picked.
func ephemeralPorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserving a free port: %w", err)
		}
		listeners = append(listeners, l)
		port := l.Addr().(*net.TCPAddr).Port
		if c, err := net.ListenPacket("udp", l.Addr().String()); err == nil {
			c.Close()
			ports = append(ports, port)
		} else if tries > 10*n {
			return nil, fmt.Errorf("reserving a free port: %w", err)
		}
	}
	return ports, nil
}

// processPorts is the process's allocator, the one FreePorts uses: its
// window is the process's until it ends.
var processPorts = sync.OnceValues(func() (*PortAllocator, error) {
	return NewPortAllocator(TestPortWindows(), nil)
})
