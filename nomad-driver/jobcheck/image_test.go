package jobcheck

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// TestCheckImage: the pre-flight (and so the Terraform provider's plan)
// accepts an image task with the default policy, renders the engine's
// in-image command, and refuses binary with image and malformed references.
func TestCheckImage(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0f", 32)
	cases := []struct {
		name string
		cfg  map[string]interface{}
		want string // "" = ok
	}{
		{"image", map[string]interface{}{"image": "localhost/oasis-sim:test"}, ""},
		{"pinned with auth block", map[string]interface{}{"image": "registry.example.com:5000/sim@" + digest,
			"auth": []interface{}{map[string]interface{}{"username": "u", "password": "p"}}}, ""},
		{"binary and image", map[string]interface{}{"image": "a/b:c", "binary": "/opt/sim"}, "binary and image are exclusive"},
		{"bad reference", map[string]interface{}{"image": "Oasis Sim"}, `image: "Oasis Sim" is not an image reference`},
		{"bad digest", map[string]interface{}{"image": "a/b@sha256:1234"}, "digest"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := map[string]interface{}{"engine": "sim", "model": "m", "port": "http", "kv_events_port": "kv"}
			for k, v := range tc.cfg {
				c[k] = v
			}
			res := Check(job(c, 0))
			must.Len(t, 1, res)
			if tc.want == "" {
				must.NoError(t, res[0].Err)
				must.Eq(t, "oasis-sim", res[0].Plan.Argv[0])
				return
			}
			must.ErrorContains(t, res[0].Err, tc.want)
		})
	}
}
