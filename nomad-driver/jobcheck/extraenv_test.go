package jobcheck

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

// TestCheckExtraEnvShapes: extra_env in each shape a job's config block
// carries it (Nomad's HCL job parser: a list of one map; JSON or the API:
// the map) is checked as the map, as the client's schema decodes it, and
// the pre-flight refuses what the client refuses.
func TestCheckExtraEnvShapes(t *testing.T) {
	cases := []struct {
		name string
		env  any
		want map[string]string // the rendered variables
		err  string            // "": ok
	}{
		{"HCL job file, as the API returns it", []any{map[string]any{"FOO": "bar", "HF_HOME": "/data/hf"}},
			map[string]string{"FOO": "bar", "HF_HOME": "/data/hf"}, ""},
		{"HCL job file, as the parser returns it", []map[string]any{{"FOO": "bar"}}, map[string]string{"FOO": "bar"}, ""},
		{"API map", map[string]any{"FOO": "bar"}, map[string]string{"FOO": "bar"}, ""},
		{"no blocks", []any{}, nil, ""},
		{"policy applies to the HCL form", []any{map[string]any{"LD_PRELOAD": "/local/x.so"}}, nil,
			"extra_env: LD_PRELOAD is refused"},
		{"two blocks", []any{map[string]any{"A": "1"}, map[string]any{"B": "2"}}, nil, "extra_env: one map expected, got 2"},
		{"a string", "FOO=bar", nil, "extra_env: wrong type"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := map[string]any{"engine": "sim", "model": "m", "port": "http", "kv_events": false, "extra_env": tc.env}
			res := Check(job(c, 0))
			must.Len(t, 1, res)
			_, clientOK := clientDecode(t, c)
			if tc.err != "" {
				must.ErrorContains(t, res[0].Err, tc.err)
				if tc.err != "extra_env: LD_PRELOAD is refused" {
					must.False(t, clientOK, must.Sprint("the client's schema must refuse what validate refuses"))
				}
				return
			}
			must.NoError(t, res[0].Err)
			must.True(t, clientOK)
			for k, v := range tc.want {
				must.Eq(t, v, res[0].Plan.Env[k])
			}
			// The map the job carried is not rewritten.
			must.Eq(t, tc.env, c["extra_env"])
		})
	}
}

// TestCheckExtraEnvJobFile parses testdata/extra_env.nomad.hcl as Nomad does
// (`nomad job run -output`: the parser behind `nomad job validate` and the
// agent's parse API, which `nomad-driver-llm validate` calls) and checks it:
// extra_env written as an object literal, a block or a map variable reaches
// the driver's validation and rendering as the map, and the policy refuses a
// loader variable in it naming the field.
func TestCheckExtraEnvJobFile(t *testing.T) {
	nomad := nomadBinary(t)
	parse := func(vars ...string) *nomadapi.Job {
		args := []string{"job", "run", "-output"}
		for _, v := range vars {
			args = append(args, "-var", v)
		}
		out, err := exec.Command(nomad, append(args, "testdata/extra_env.nomad.hcl")...).Output()
		must.NoError(t, err)
		var doc struct{ Job *nomadapi.Job }
		must.NoError(t, json.Unmarshal(out, &doc))
		return doc.Job
	}

	want := map[string]map[string]string{
		"literal":  {"FOO": "bar", "PYTHONHASHSEED": "0"},
		"block":    {"FOO": "bar"},
		"variable": {"HF_HOME": "/data/hf"},
	}
	job := parse()
	res := Check(job)
	must.Len(t, 3, res)
	for i, r := range res {
		must.NoError(t, r.Err, must.Sprintf("task %s", r.Task))
		for k, v := range want[r.Task] {
			must.Eq(t, v, r.Plan.Env[k], must.Sprintf("task %s: %s", r.Task, k))
		}
		// The client decodes the same block to the same variables.
		cfg, ok := clientDecode(t, job.TaskGroups[0].Tasks[i].Config)
		must.True(t, ok, must.Sprintf("task %s: the client refuses its config", r.Task))
		must.Eq(t, want[r.Task], map[string]string(cfg.ExtraEnv))
	}

	res = Check(parse(`env={LD_PRELOAD="/local/x.so"}`))
	must.ErrorContains(t, res[2].Err, `extra_env: LD_PRELOAD is refused`)
}

// nomadBinary is $OASIS_NOMAD_BIN, bin/nomad (make hashistack) or nomad on $PATH.
func nomadBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OASIS_NOMAD_BIN"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../../bin/nomad"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("nomad")
	if err != nil {
		t.Skip("no nomad binary (make hashistack, or set OASIS_NOMAD_BIN)")
	}
	return p
}
