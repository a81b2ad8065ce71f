package testbed

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// Nomad hands out a client's dynamic ports without knowing what another agent on the machine
// handed out: two stacks on 127.0.0.1 (`make test` runs two e2e packages at a time) could give two
// tasks the same port, and the second task would fail to bind. Each stack's client therefore takes
// a window of Nomad's default dynamic range (20000-31999, below the kernel's ephemeral ports) that
// no other stack on the machine holds: one lock file per window (flock), held until the stack
// closes or its process ends.
const (
	dynamicPortsMin     = 20000
	dynamicPortsWidth   = 1000
	dynamicPortsWindows = 12
)

// portWindow is a claimed range of dynamic ports.
type portWindow struct {
	min, max int
	lock     *os.File
}

// claimPortWindow takes the first window no other stack holds.
func claimPortWindow() (*portWindow, error) {
	for i := range dynamicPortsWindows {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("oasis-testbed-ports-%d.lock", i))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			return nil, fmt.Errorf("claiming a dynamic port window: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close()
			continue
		}
		lo := dynamicPortsMin + i*dynamicPortsWidth
		return &portWindow{min: lo, max: lo + dynamicPortsWidth - 1, lock: f}, nil
	}
	return nil, errors.New("every dynamic port window of 20000-31999 is held by another test bed stack")
}

// clientConfig is the Nomad client block's dynamic port range.
func (w *portWindow) clientConfig() string {
	return fmt.Sprintf("  min_dynamic_port = %d\n  max_dynamic_port = %d\n", w.min, w.max)
}

// release gives the window back.
func (w *portWindow) release() {
	if w != nil && w.lock != nil {
		w.lock.Close()
		w.lock = nil
	}
}
