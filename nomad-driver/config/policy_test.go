package config

import (
	"testing"

	"github.com/shoenig/test/must"
)

// TestCheckPolicy: a task's own binary, loader and interpreter variables in
// extra_env and a root user are refused unless the plugin's policy allows
// them, each error naming the field and the option that would allow it.
func TestCheckPolicy(t *testing.T) {
	base := func() TaskConfig {
		return TaskConfig{Engine: EngineSim, Model: "m", Port: "http"}
	}
	cases := []struct {
		name   string
		mutate func(*TaskConfig)
		policy Policy
		user   string
		want   []string // substrings; none = allowed
	}{
		{"plain task", func(*TaskConfig) {}, DefaultPolicy(), "", nil},
		{"task binary refused", func(c *TaskConfig) { c.Binary = "/bin/sh" }, DefaultPolicy(), "",
			[]string{`binary: "/bin/sh": a task may not choose the engine's executable`, "binaries { sim = ", "allow_task_binary = true"}},
		{"task binary allowed", func(c *TaskConfig) { c.Binary = "/bin/sh" }, Policy{AllowTaskBinary: true, DefaultUser: "nobody"}, "", nil},
		{"LD_PRELOAD refused", func(c *TaskConfig) { c.ExtraEnv = map[string]string{"LD_PRELOAD": "/local/x.so"} }, DefaultPolicy(), "",
			[]string{"extra_env: LD_PRELOAD is refused: dynamic loader variables", `allowed_env = ["LD_PRELOAD"]`}},
		{"LD_LIBRARY_PATH refused", func(c *TaskConfig) { c.ExtraEnv = map[string]string{"LD_LIBRARY_PATH": "/local"} }, DefaultPolicy(), "",
			[]string{"extra_env: LD_LIBRARY_PATH is refused"}},
		{"PATH refused", func(c *TaskConfig) { c.ExtraEnv = map[string]string{"PATH": "/local:/usr/bin"} }, DefaultPolicy(), "",
			[]string{"extra_env: PATH is refused: PATH chooses which executables"}},
		{"interpreter variables refused", func(c *TaskConfig) {
			c.ExtraEnv = map[string]string{"PYTHONPATH": "/local", "PYTHONSTARTUP": "/local/s.py", "NODE_OPTIONS": "--require /local/x.js", "BASH_ENV": "/local/x.sh"}
		}, DefaultPolicy(), "", []string{"extra_env: BASH_ENV is refused", "extra_env: NODE_OPTIONS is refused", "extra_env: PYTHONPATH is refused", "extra_env: PYTHONSTARTUP is refused"}},
		{"named variable allowed", func(c *TaskConfig) { c.ExtraEnv = map[string]string{"PYTHONPATH": "/opt/plugins"} },
			Policy{AllowedEnv: []string{"PYTHONPATH"}, DefaultUser: "nobody"}, "", nil},
		{"allowing one does not allow another", func(c *TaskConfig) { c.ExtraEnv = map[string]string{"PYTHONPATH": "/x", "LD_PRELOAD": "/x.so"} },
			Policy{AllowedEnv: []string{"PYTHONPATH"}, DefaultUser: "nobody"}, "", []string{"extra_env: LD_PRELOAD is refused"}},
		{"ordinary variables pass", func(c *TaskConfig) {
			c.ExtraEnv = map[string]string{"HF_HOME": "/data/hf", "PYTHONHASHSEED": "0", "VLLM_LOGGING_LEVEL": "DEBUG"}
		},
			DefaultPolicy(), "", nil},
		{"root user refused", func(*TaskConfig) {}, DefaultPolicy(), "root",
			[]string{`user: "root": tasks of driver llm run as root only where the client's plugin config sets default_user = "root"`}},
		{"uid 0 refused", func(*TaskConfig) {}, DefaultPolicy(), "0", []string{`user: "0"`}},
		{"root allowed where the default is root", func(*TaskConfig) {}, Policy{DefaultUser: "root"}, "root", nil},
		{"other user allowed", func(*TaskConfig) {}, DefaultPolicy(), "oasis", nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mutate(&c)
			err := c.CheckPolicy(tc.policy, tc.user)
			if len(tc.want) == 0 {
				must.NoError(t, err)
				return
			}
			must.Error(t, err)
			for _, w := range tc.want {
				must.StrContains(t, err.Error(), w)
			}
		})
	}
}

// TestPluginPolicy: the plugin block's defaults are the strict policy, and
// bad policy options are errors naming the option.
func TestPluginPolicy(t *testing.T) {
	must.Eq(t, DefaultPolicy(), PluginConfig{}.Policy())
	must.Eq(t, "nobody", PluginConfig{}.Policy().DefaultUser)
	pc := PluginConfig{AllowTaskBinary: true, AllowedEnv: []string{"PYTHONPATH"}, DefaultUser: "oasis"}
	must.Eq(t, Policy{AllowTaskBinary: true, AllowedEnv: []string{"PYTHONPATH"}, DefaultUser: "oasis"}, pc.Policy())

	bad := PluginConfig{AllowedEnv: []string{"A=B"}, DefaultUser: "a b"}
	_, err := bad.Validate()
	must.ErrorContains(t, err, `allowed_env: invalid variable name "A=B"`)
	must.ErrorContains(t, err, `default_user: "a b" is not a user name or id`)
}
