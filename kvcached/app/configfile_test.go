package app

import (
	"os"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/agentconfig"
)

// The example file holds every key, and the reference table in
// kvcached/README.md a row for each.
func TestConfigExampleAndReadme(t *testing.T) {
	const example = "testdata/kvcached.hcl"
	src, err := os.ReadFile(example)
	must.NoError(t, err)
	settings, err := agentconfig.Parse(ConfigKeys, example, src)
	must.NoError(t, err)
	seen := map[string]bool{}
	for _, s := range settings {
		seen[s.Key.Path()] = true
	}
	readme, err := os.ReadFile("../README.md")
	must.NoError(t, err)
	for _, k := range ConfigKeys {
		must.True(t, seen[k.Path()], must.Sprintf("%s missing from %s", k.Path(), example))
		must.StrContains(t, string(readme), "`"+k.Name+"` | `--"+k.Flag+"`", must.Sprintf("README row of %s", k.Path()))
	}
}
