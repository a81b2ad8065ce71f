//go:build linux

package supervisor

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// TestMain makes the test binary its own supervisor: Launch re-executes it
// as "<test binary> supervisor", and Main serves that mode.
func TestMain(m *testing.M) {
	Main()
	if req := os.Getenv(launcherEnv); req != "" {
		os.Exit(launcher(req))
	}
	os.Exit(m.Run())
}

// launcherEnv makes the test binary a stand-in driver: it Launches the
// command of the JSON request, prints the State as JSON and exits without
// Close or Kill, as a driver that dies does.
const launcherEnv = "OASIS_SUPERVISOR_TEST_LAUNCH"

type launchRequest struct {
	Config  Config
	Command Command
}

func launcher(req string) int {
	var r launchRequest
	if err := json.Unmarshal([]byte(req), &r); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	h, err := Launch(context.Background(), r.Config, r.Command)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := json.NewEncoder(os.Stdout).Encode(h.State()); err != nil {
		return 1
	}
	return 0
}

// testConfig is a Config with a short socket directory of the test's own
// (t.TempDir paths can pass the 107-byte limit) and the supervisor's log
// in the test's directory, printed when the test fails.
func testConfig(t *testing.T) Config {
	t.Helper()
	sockDir, err := os.MkdirTemp("", "sv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	logFile := filepath.Join(t.TempDir(), "supervisor.log")
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(logFile)
			t.Logf("supervisor log:\n%s", b)
		}
	})
	return Config{
		Logger:    hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: testWriter{t}}),
		LogFile:   logFile,
		SocketDir: filepath.Join(sockDir, "s"),
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// shell is a Command running script with /bin/sh in a fresh directory,
// its stdout in dir/stdout, with FOO=bar in its environment.
func shell(t *testing.T, script string) (Command, string) {
	t.Helper()
	dir := t.TempDir()
	return Command{
		Path:       "/bin/sh",
		Args:       []string{"-c", script},
		Env:        []string{"FOO=bar", "PATH=/usr/bin:/bin", "DIR=" + dir},
		Dir:        dir,
		StdoutPath: filepath.Join(dir, "stdout"),
		StderrPath: filepath.Join(dir, "stderr"),
	}, dir
}

// launch starts cmd and Kills its supervisor at the test's end.
func launch(t *testing.T, cfg Config, cmd Command) *Handle {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	h, err := Launch(ctx, cfg, cmd)
	if err != nil {
		t.Fatalf("Launch: %v", err)
	}
	t.Cleanup(func() {
		if err := h.Kill(); err != nil {
			t.Errorf("Kill: %v", err)
		}
	})
	return h
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	p, err := readProc(pid)
	return err == nil && p.state != 'Z' && p.state != 'X'
}

// waitFile waits until dir/name holds want, and returns its content.
func waitFile(t *testing.T, path, want string) string {
	t.Helper()
	var got string
	testutil.Eventually(t, 20*time.Second, path+" to contain "+strconv.Quote(want), func() bool {
		b, _ := os.ReadFile(path)
		got = string(b)
		return strings.Contains(got, want)
	})
	return got
}

// pidIn reads a pid a script wrote to a file.
func pidIn(t *testing.T, path string) int {
	t.Helper()
	waitFile(t, path, "\n")
	b, _ := os.ReadFile(path)
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatalf("pid in %s: %v", path, err)
	}
	return pid
}

func ctxT(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func wait(t *testing.T, h *Handle) *ProcessState {
	t.Helper()
	ps, err := h.Wait(ctxT(t, 30*time.Second))
	if err != nil {
		t.Fatalf("Wait: %v", err)
	}
	return ps
}

// gate makes a FIFO a script blocks on ("read x < $DIR/gate") until open
// releases it.
func gate(t *testing.T, dir string) (open func()) {
	t.Helper()
	p := filepath.Join(dir, "gate")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := os.WriteFile(p, []byte("go\n"), 0o600); err != nil {
			t.Fatalf("opening the gate: %v", err)
		}
	}
}

func isRoot() bool { return os.Geteuid() == 0 }
