package driver

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/shoenig/test/must"
	"golang.org/x/sys/unix"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
)

// driverHarness serves a driver over go-plugin's in-memory gRPC connection
// through Oasis's implementation of Nomad's driver protocol, and calls it
// through the protocol's client, as a Nomad client does. It builds
// allocation directories and log FIFOs the way the client does before
// StartTask.
type driverHarness struct {
	drivers.DriverPlugin
	impl   drivers.DriverPlugin // the driver served, for what a test does beside the protocol
	t      *testing.T
	logger hclog.Logger
	client *plugin.GRPCClient
}

// testLogger logs through t.
func testLogger(t testing.TB) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: t.Name(), Level: hclog.Debug, Output: hclog.DefaultOutput})
}

// newID returns a random UUID-shaped id, as Nomad's allocation and task ids.
func newID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func newDriverHarness(t *testing.T, d drivers.DriverPlugin) *driverHarness {
	t.Helper()
	logger := testLogger(t).Named("driver_harness")
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		base.PluginTypeDriver: &drivers.PluginDriver{Impl: d},
		base.PluginTypeBase:   &base.PluginBase{Impl: d},
	})
	raw, err := client.Dispense(base.PluginTypeDriver)
	must.NoError(t, err)
	return &driverHarness{DriverPlugin: raw.(drivers.DriverPlugin), impl: d, t: t, logger: logger, client: client}
}

// Kill closes the client connection, which shuts the in-memory server down
// through go-plugin's controller (stopping the server as well races with
// that shutdown).
func (h *driverHarness) Kill() {
	_ = h.client.Close()
}

// MkAllocDir builds the allocation and task directories of tc in a new
// temporary directory (as Nomad's client lays them out), sets the task
// directory variables in tc.Env and, with logs, makes the task's stdout and
// stderr FIFOs and copies what arrives on them into alloc/logs/<task>.std*.0
// (as Nomad's logmon does). The returned function stops the copy and
// removes the directories.
func (h *driverHarness) MkAllocDir(tc *drivers.TaskConfig, logs bool) func() {
	t := h.t
	dir, err := os.MkdirTemp("", "oasis-driver-harness-")
	must.NoError(t, err)
	tc.AllocDir = filepath.Join(dir, tc.AllocID)
	td := tc.TaskDir()
	for _, d := range []string{td.SharedAllocDir, td.LogDir, filepath.Join(td.SharedAllocDir, "tmp"),
		filepath.Join(td.SharedAllocDir, "data"), td.Dir, td.LocalDir, td.SecretsDir, td.PrivateDir, filepath.Join(td.Dir, "tmp")} {
		must.NoError(t, os.MkdirAll(d, 0o777))
		must.NoError(t, os.Chmod(d, 0o777))
	}
	if tc.Env == nil {
		tc.Env = map[string]string{}
	}
	for k, v := range map[string]string{
		"NOMAD_ALLOC_DIR":   td.SharedAllocDir,
		"NOMAD_TASK_DIR":    td.LocalDir,
		"NOMAD_SECRETS_DIR": td.SecretsDir,
		"NOMAD_ALLOC_ID":    tc.AllocID,
		"NOMAD_TASK_NAME":   tc.Name,
	} {
		if _, ok := tc.Env[k]; !ok {
			tc.Env[k] = v
		}
	}
	cleanup := func() { _ = os.RemoveAll(dir) }
	if !logs {
		return cleanup
	}
	tc.StdoutPath = filepath.Join(td.LogDir, "."+tc.Name+".stdout.fifo")
	tc.StderrPath = filepath.Join(td.LogDir, "."+tc.Name+".stderr.fifo")
	stdout := startLogCopy(t, tc.StdoutPath, filepath.Join(td.LogDir, tc.Name+".stdout.0"))
	stderr := startLogCopy(t, tc.StderrPath, filepath.Join(td.LogDir, tc.Name+".stderr.0"))
	return func() {
		stdout()
		stderr()
		cleanup()
	}
}

// startLogCopy makes the FIFO fifo and copies what is written into it to
// file until the returned function is called. The FIFO is held open for
// reading and writing, so a writer never blocks on open and a restarted
// engine's output keeps arriving.
func startLogCopy(t *testing.T, fifo, file string) (stop func()) {
	t.Helper()
	must.NoError(t, unix.Mkfifo(fifo, 0o666))
	must.NoError(t, os.Chmod(fifo, 0o666))
	r, err := os.OpenFile(fifo, os.O_RDWR, os.ModeNamedPipe)
	must.NoError(t, err)
	w, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	must.NoError(t, err)
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := io.Copy(w, r); err != nil && !errors.Is(err, os.ErrClosed) {
			t.Logf("copying %s: %v", fifo, err)
		}
	})
	return func() {
		_ = r.Close()
		wg.Wait()
		_ = w.Close()
	}
}
