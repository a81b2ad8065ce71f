package driver

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oasis-llm/oasis/internal/gobuild"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/nomad-driver/supervisor"
)

// simBinEnv carries the oasis-sim binary built by the parent test process.
const simBinEnv = "OASIS_DRIVER_TEST_SIM"

// TestMain runs the package's tests as an unprivileged user, where engines
// run as the plugin's own account (a root plugin would switch them to
// default_user) and the tests can tell their processes apart. As root, the
// test binary and an oasis-sim build are copied into a world-readable
// temporary directory and the binary re-executes itself there as nobody
// (65534) via setpriv. If that is not possible the run fails: these tests
// are never silently skipped. The test binary is also the engines'
// supervisor (the driver re-executes its own binary): supervisor.Main runs
// that mode first.
func TestMain(m *testing.M) {
	if supervisor.Main() {
		return
	}
	if os.Getuid() == 0 {
		os.Exit(reexecUnprivileged())
	}
	if os.Getenv(simBinEnv) != "" {
		os.Exit(m.Run()) // the re-executed child: the parent owns and removes TMPDIR
	}
	os.Exit(runUnprivileged(m))
}

// runUnprivileged is a direct run by a non-root user: it builds oasis-sim
// and keeps everything (Nomad's harness leaves empty dirs) in one temp dir.
func runUnprivileged(m *testing.M) int {
	dir, err := os.MkdirTemp("", "oasis-driver-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "driver tests:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	if err := buildSim(dir); err != nil {
		fmt.Fprintln(os.Stderr, "driver tests:", err)
		return 1
	}
	os.Setenv(simBinEnv, filepath.Join(dir, "oasis-sim"))
	os.Setenv("TMPDIR", dir)
	return m.Run()
}

func buildSim(dir string) error {
	return gobuild.Commands(context.Background(), dir, "github.com/oasis-llm/oasis/cmd/oasis-sim")
}

func reexecUnprivileged() int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "driver tests must run unprivileged and could not: "+format+"\n", args...)
		return 1
	}
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		return fail("setpriv not found: %v", err)
	}
	dir, err := os.MkdirTemp("", "oasis-driver-test-")
	if err != nil {
		return fail("%v", err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil {
		return fail("%v", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fail("%v", err)
	}
	bin := filepath.Join(dir, filepath.Base(self))
	if err := copyExecutable(self, bin); err != nil {
		return fail("copying the test binary: %v", err)
	}
	if err := buildSim(dir); err != nil {
		return fail("%v", err)
	}
	// go test's -test.testlogfile points into a root-only directory.
	var args []string
	for _, a := range os.Args[1:] {
		if !strings.HasPrefix(a, "-test.testlogfile") && !strings.HasPrefix(a, "-test.coverprofile") {
			args = append(args, a)
		}
	}
	cmd := exec.Command(setpriv, append([]string{"--reuid=65534", "--regid=65534", "--clear-groups", "--", bin}, args...)...)
	cmd.Dir = dir
	// The child's temp files (Nomad's harness leaves empty alloc dirs
	// behind) go under dir, which this process removes.
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return fail("%v", err)
	}
	if err := os.Chown(tmp, 65534, 65534); err != nil {
		return fail("%v", err)
	}
	// Its free ports come from a window claimed where every other test
	// process claims them, not in its own TMPDIR.
	cmd.Env = append(os.Environ(), simBinEnv+"="+filepath.Join(dir, "oasis-sim"), "HOME="+tmp, "TMPDIR="+tmp,
		testutil.LockDirEnv+"="+testutil.LockDir())
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		return fail("running as nobody: %v", err)
	}
	return 0
}

func copyExecutable(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
