package driver

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad/client/allocdir"
	"github.com/hashicorp/nomad/client/logmon"
	"github.com/hashicorp/nomad/helper/testlog"
	"github.com/hashicorp/nomad/plugins/base"
	"github.com/hashicorp/nomad/plugins/drivers"
	"github.com/shoenig/test/must"
)

// driverHarness serves a driver over go-plugin's in-memory gRPC connection,
// as a Nomad client talks to it, and builds allocation directories the way
// the client does before StartTask. It replaces Nomad's own test harness,
// which is built against an older go-plugin than the module uses.
type driverHarness struct {
	drivers.DriverPlugin
	t      *testing.T
	logger hclog.Logger
	client *plugin.GRPCClient
	server *plugin.GRPCServer
}

func newDriverHarness(t *testing.T, d drivers.DriverPlugin) *driverHarness {
	t.Helper()
	logger := testlog.HCLogger(t).Named("driver_harness")
	client, server := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		base.PluginTypeDriver: drivers.NewDriverPlugin(d, logger),
		base.PluginTypeBase:   &base.PluginBase{Impl: d},
	})
	raw, err := client.Dispense(base.PluginTypeDriver)
	must.NoError(t, err)
	return &driverHarness{DriverPlugin: raw.(drivers.DriverPlugin), t: t, logger: logger, client: client, server: server}
}

// Kill closes the client connection and stops the in-memory server.
func (h *driverHarness) Kill() {
	_ = h.client.Close()
	h.server.Stop()
}

// MkAllocDir builds the allocation and task directories of tc in a new
// temporary directory, sets the task directory variables in tc.Env and,
// with logs, starts logmon on the task's stdout and stderr FIFOs. The
// returned function stops logmon and removes the directories.
func (h *driverHarness) MkAllocDir(tc *drivers.TaskConfig, logs bool) func() {
	t := h.t
	dir, err := os.MkdirTemp("", "oasis-driver-harness-")
	must.NoError(t, err)
	ad := allocdir.NewAllocDir(h.logger, dir, tc.AllocID)
	must.NoError(t, ad.Build())
	tc.AllocDir = ad.AllocDir
	td := ad.NewTaskDir(tc.Name)
	must.NoError(t, td.Build(false, nil))
	if tc.Env == nil {
		tc.Env = map[string]string{}
	}
	for k, v := range map[string]string{
		"NOMAD_ALLOC_DIR":   ad.SharedDir,
		"NOMAD_TASK_DIR":    td.LocalDir,
		"NOMAD_SECRETS_DIR": td.SecretsDir,
		"NOMAD_ALLOC_ID":    tc.AllocID,
		"NOMAD_TASK_NAME":   tc.Name,
	} {
		if _, ok := tc.Env[k]; !ok {
			tc.Env[k] = v
		}
	}
	cleanup := func() {
		_ = ad.Destroy()
		_ = os.RemoveAll(dir)
	}
	if !logs {
		return cleanup
	}
	lm := logmon.NewLogMon(h.logger.Named("logmon"))
	tc.StdoutPath = filepath.Join(td.LogDir, "."+tc.Name+".stdout.fifo")
	tc.StderrPath = filepath.Join(td.LogDir, "."+tc.Name+".stderr.fifo")
	must.NoError(t, lm.Start(&logmon.LogConfig{
		LogDir:        td.LogDir,
		StdoutLogFile: tc.Name + ".stdout",
		StderrLogFile: tc.Name + ".stderr",
		StdoutFifo:    tc.StdoutPath,
		StderrFifo:    tc.StderrPath,
		MaxFiles:      10,
		MaxFileSizeMB: 10,
	}))
	return func() {
		_ = lm.Stop()
		cleanup()
	}
}
