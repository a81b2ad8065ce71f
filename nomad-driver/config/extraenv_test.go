package config

import (
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/nomadplugin/base"
	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

// TestExtraEnvDecodesAsNomadsClientEncodes takes extra_env the way a job's config block reaches
// StartTask (hclspec → cty → msgpack → DecodeDriverConfig) in each shape the client gets it:
// Nomad's HCL job parser turns `extra_env = { FOO = "bar" }` (and the block `extra_env { ... }`)
// into a list of one map; a job submitted as JSON or through the API may carry the map itself.
func TestExtraEnvDecodesAsNomadsClientEncodes(t *testing.T) {
	cases := []struct {
		name    string
		env     any // nil: unset
		want    map[string]string
		wantErr bool
	}{
		{"unset", nil, nil, false},
		{"HCL job file (list of one map)", []map[string]any{{"FOO": "bar", "HF_HOME": "/data/hf"}}, map[string]string{"FOO": "bar", "HF_HOME": "/data/hf"}, false},
		{"list of one map as decoded JSON", []any{map[string]any{"FOO": "bar"}}, map[string]string{"FOO": "bar"}, false},
		{"API map", map[string]any{"FOO": "bar"}, map[string]string{"FOO": "bar"}, false},
		{"API map of strings", map[string]string{"A": "1", "B": "two"}, map[string]string{"A": "1", "B": "two"}, false},
		{"numbers become strings", map[string]any{"SEED": 0}, map[string]string{"SEED": "0"}, false},
		{"empty map", map[string]any{}, map[string]string{}, false},
		{"two maps", []map[string]any{{"A": "1"}, {"B": "2"}}, nil, true},
		{"a string", "FOO=bar", nil, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			raw := map[string]any{"engine": "sim", "model": "m"}
			if tc.env != nil {
				raw["extra_env"] = tc.env
			}
			buf, err := hclspec.Encode(TaskSpec, raw)
			if tc.wantErr {
				must.Error(t, err, must.Sprint("the client's schema must refuse it"))
				return
			}
			must.NoError(t, err)
			var cfg TaskConfig
			must.NoError(t, base.MsgPackDecode(buf, &cfg))
			if tc.want == nil {
				must.MapEmpty(t, cfg.ExtraEnv)
				return
			}
			must.Eq(t, tc.want, cfg.ExtraEnv)
		})
	}
}
