package driver

import (
	"context"
	"os"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/drivers"
	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// newPolicyHarness is newHarness with a whole plugin config.
func newPolicyHarness(t *testing.T, pc config.PluginConfig) *driverHarness {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	h := newDriverHarness(t, New(ctx, testLogger(t)))
	t.Cleanup(h.Kill)
	if pc.Binaries == nil {
		pc.Binaries = map[string]string{"sim": os.Getenv(simBinEnv)}
	}
	var data []byte
	must.NoError(t, base.MsgPackEncode(&data, &pc))
	must.NoError(t, h.SetConfig(&base.Config{PluginConfig: data, AgentConfig: &base.AgentConfig{
		Driver: &base.ClientDriverConfig{},
	}}))
	return h
}

// TestDriver_PolicyRefusesBeforeStart: StartTask refuses a task's own
// binary (a shell running a script the job wrote), loader variables in
// extra_env and a root task user unless the plugin config allows them, and
// launches nothing; allowed by the plugin, the same task starts.
func TestDriver_PolicyRefusesBeforeStart(t *testing.T) {
	script := t.TempDir() + "/engine.sh"
	must.NoError(t, os.WriteFile(script, []byte("#!/bin/sh\nexec \"$OASIS_DRIVER_TEST_SIM\" \"$@\"\n"), 0o755))
	cases := []struct {
		name   string
		plugin config.PluginConfig
		mutate func(*config.TaskConfig)
		user   string
		want   string // "" = starts
	}{
		{"task binary refused", config.PluginConfig{}, func(c *config.TaskConfig) { c.Binary = "/bin/sh"; c.Model = "local/x.sh" }, "",
			`binary: "/bin/sh": a task may not choose the engine's executable`},
		{"task binary allowed", config.PluginConfig{AllowTaskBinary: true}, func(c *config.TaskConfig) { c.Binary = script }, "", ""},
		{"LD_PRELOAD refused", config.PluginConfig{}, func(c *config.TaskConfig) { c.ExtraEnv = map[string]string{"LD_PRELOAD": "/tmp/x.so"} }, "",
			"extra_env: LD_PRELOAD is refused"},
		{"PYTHONPATH allowed by name", config.PluginConfig{AllowedEnv: []string{"PYTHONPATH"}},
			func(c *config.TaskConfig) { c.ExtraEnv = map[string]string{"PYTHONPATH": "/opt/x"} }, "", ""},
		{"root user refused", config.PluginConfig{}, nil, "root", `user: "root": tasks of driver llm run as root only`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			h := newPolicyHarness(t, tc.plugin)
			task := newSimTask(t, h, tc.want == "", tc.mutate)
			task.cfg.User = tc.user
			task.cfg.Env[simBinEnv] = os.Getenv(simBinEnv)
			_, _, err := h.StartTask(task.cfg)
			if tc.want == "" {
				must.NoError(t, err)
				must.NoError(t, h.DestroyTask(task.cfg.ID, true))
				return
			}
			must.ErrorContains(t, err, tc.want)
			_, err = h.InspectTask(task.cfg.ID)
			must.ErrorContains(t, err, drivers.ErrTaskNotFound.Error())
		})
	}
}

// TestTaskUser: tasks without a user run as the plugin's default_user when
// the plugin runs as root, as the plugin's own user otherwise (it cannot
// switch); a task's user is kept unless it is uid 0 under another name.
func TestTaskUser(t *testing.T) {
	cases := []struct {
		name, taskUser string
		policy         config.Policy
		euid           int
		want, err      string
	}{
		{"default applied as root", "", config.DefaultPolicy(), 0, "nobody", ""},
		{"configured default", "", config.Policy{DefaultUser: "oasis"}, 0, "oasis", ""},
		{"unprivileged plugin keeps its user", "", config.DefaultPolicy(), 65534, "", ""},
		{"task user kept", "nobody", config.DefaultPolicy(), 0, "nobody", ""},
		{"root alias refused", "root", config.DefaultPolicy(), 0, "", `user: "root" is uid 0`},
		{"root where the default is root", "root", config.Policy{DefaultUser: "root"}, 0, "root", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := taskUser(&drivers.TaskConfig{User: tc.taskUser}, tc.policy, tc.euid)
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				return
			}
			must.NoError(t, err)
			must.EqOp(t, tc.want, got)
		})
	}
}
