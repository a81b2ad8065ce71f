package jobcheck

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// TestCheckPolicy: the pre-flight refuses what the clients' plugin policy
// refuses (the defaults unless told otherwise): a task's own binary, loader
// variables in extra_env, a root task user, naming the field.
func TestCheckPolicy(t *testing.T) {
	base := func() map[string]interface{} {
		return map[string]interface{}{"engine": "sim", "model": "m", "port": "http", "kv_events_port": "kv"}
	}
	cases := []struct {
		name   string
		mutate func(map[string]interface{})
		user   string
		policy config.Policy
		want   string // "" = ok
	}{
		{"default ok", func(map[string]interface{}) {}, "", config.DefaultPolicy(), ""},
		{"task binary", func(c map[string]interface{}) { c["binary"] = "/bin/sh"; c["model"] = "local/x.sh" }, "", config.DefaultPolicy(),
			`binary: "/bin/sh": a task may not choose the engine's executable`},
		{"task binary allowed", func(c map[string]interface{}) { c["binary"] = "/opt/sim" }, "", config.Policy{AllowTaskBinary: true, DefaultUser: "nobody"}, ""},
		{"LD_PRELOAD", func(c map[string]interface{}) { c["extra_env"] = map[string]interface{}{"LD_PRELOAD": "/local/x.so"} }, "", config.DefaultPolicy(),
			"extra_env: LD_PRELOAD is refused"},
		{"LD_PRELOAD allowed by name", func(c map[string]interface{}) { c["extra_env"] = map[string]interface{}{"LD_PRELOAD": "/opt/x.so"} }, "",
			config.Policy{AllowedEnv: []string{"LD_PRELOAD"}, DefaultUser: "nobody"}, ""},
		{"root user", func(map[string]interface{}) {}, "root", config.DefaultPolicy(), `user: "root"`},
		{"abbreviated owned flag", func(c map[string]interface{}) { c["extra_args"] = []interface{}{"--served_model_name", "x"} }, "", config.DefaultPolicy(),
			`extra_args: "--served_model_name" (the engine reads it as --served-model-name)`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := base()
			tc.mutate(c)
			j := job(c, 0)
			j.TaskGroups[0].Tasks[0].User = tc.user
			res := CheckPolicy(j, tc.policy)
			must.Len(t, 1, res)
			if tc.want == "" {
				must.NoError(t, res[0].Err)
				return
			}
			must.ErrorContains(t, res[0].Err, tc.want)
			// Check is CheckPolicy with the defaults.
			if tc.policy.AllowTaskBinary == false && len(tc.policy.AllowedEnv) == 0 {
				must.ErrorContains(t, Check(j)[0].Err, tc.want)
			}
		})
	}
}
