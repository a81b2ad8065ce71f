package testutil

import (
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// stopGrace is how long Stop waits after SIGTERM before it kills.
const stopGrace = 10 * time.Second

// Process is a command a test started. It runs in its own process group,
// dies with the test binary, and is stopped when the test ends; its output
// is kept, and logged if the test failed.
type Process struct {
	cmd    *exec.Cmd
	output SyncBuffer
	exited chan struct{}
	err    error // cmd.Wait's, once exited is closed
}

// Start starts cmd for the duration of the test. Its stdout and stderr,
// where cmd does not set them, go to Output.
func Start(t testing.TB, cmd *exec.Cmd) *Process {
	t.Helper()
	p := &Process{cmd: cmd, exited: make(chan struct{})}
	if cmd.Stdout == nil {
		cmd.Stdout = &p.output
	}
	if cmd.Stderr == nil {
		cmd.Stderr = &p.output
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	must.NoError(t, cmd.Start())
	go func() {
		p.err = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.Stop()
		if t.Failed() {
			t.Logf("%s output:\n%s", p.name(), p.Output())
		}
	})
	return p
}

func (p *Process) name() string { return filepath.Base(p.cmd.Path) }

// Output returns what the process wrote so far to the stdout and stderr
// that Start gave it.
func (p *Process) Output() string { return p.output.String() }

// Pid returns the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Kill kills the process at once, as a crash would.
func (p *Process) Kill() error { return p.cmd.Process.Kill() }

// Exited reports whether the process has exited.
func (p *Process) Exited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// Stop sends the process group SIGTERM, kills it if the process has not
// exited within stopGrace, and returns how the process exited (nil: status
// 0). Stopping a process that has exited returns how it exited.
func (p *Process) Stop() error {
	if p.Exited() {
		return p.err
	}
	pid := p.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-p.exited:
		return p.err
	case <-time.After(stopGrace):
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-p.exited
		return fmt.Errorf("%s did not exit within %s of SIGTERM and was killed", p.name(), stopGrace)
	}
}

// SimConfig is how StartSim runs oasis-sim.
type SimConfig struct {
	// Bin is the oasis-sim binary (see RunWithCommand and BuildCommand).
	Bin string
	// Model is the model it serves.
	Model string
	// Port is its API's port on 127.0.0.1; 0 picks a free one.
	Port int
	// Args are more flags of oasis-sim serve.
	Args []string
	// Env is added to its environment (e.g. VLLM_NIXL_SIDE_CHANNEL_PORT:
	// two disaggregated sims on one host need side channels of their own).
	Env []string
}

// Sim is an oasis-sim process a test started.
type Sim struct {
	*Process
	// Addr is its API's address, 127.0.0.1:port.
	Addr string
}

// StartSim runs oasis-sim serve for the duration of the test and waits
// until its /health answers 200.
func StartSim(t testing.TB, cfg SimConfig) *Sim {
	t.Helper()
	if cfg.Port == 0 {
		cfg.Port = FreePort(t)
	}
	args := append([]string{"serve", cfg.Model, "--port", strconv.Itoa(cfg.Port)}, cfg.Args...)
	s := &Sim{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(cfg.Port))}
	cmd := exec.Command(cfg.Bin, args...)
	if len(cfg.Env) > 0 {
		cmd.Env = append(os.Environ(), cfg.Env...)
	}
	s.Process = Start(t, cmd)
	Eventually(t, 20*time.Second, "oasis-sim to answer /health", func() bool {
		return s.Exited() || s.healthy()
	})
	if s.Exited() {
		t.Fatalf("oasis-sim exited before it was healthy: %v", s.err)
	}
	return s
}

func (s *Sim) healthy() bool {
	resp, err := healthClient.Get("http://" + s.Addr + "/health")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// healthClient bounds a health check, so that a process that accepts and
// never answers fails the wait instead of hanging it.
var healthClient = &http.Client{Timeout: time.Second}
