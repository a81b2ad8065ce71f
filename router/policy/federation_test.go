package policy

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/scoring"
)

func TestFederationSection(t *testing.T) {
	reg, err := scoring.NewRegistry(scoring.BuiltinTerms()...)
	must.NoError(t, err)
	on := DefaultFederation()
	on.Enabled, on.Margin, on.MaxSpillFraction = true, 20*time.Millisecond, 0.5
	for _, tc := range []struct {
		name, doc string
		want      FederationSettings
		err       string
	}{
		{name: "absent: off", doc: `{"policy":"round_robin"}`, want: DefaultFederation()},
		{name: "json", doc: `{"policy":"round_robin","federation":{"enabled":true,"margin":"20ms","max_spill_fraction":0.5}}`, want: on},
		{name: "hcl", doc: "policy = \"round_robin\"\nfederation {\n enabled = true\n margin = \"20ms\"\n max_spill_fraction = 0.5\n}\n", want: on},
		{name: "negative margin", doc: `{"policy":"round_robin","federation":{"margin":"-1s"}}`, err: "federation.margin"},
		{name: "fraction above 1", doc: `{"policy":"round_robin","federation":{"max_spill_fraction":1.5}}`, err: "federation.max_spill_fraction"},
		{name: "resume above max", doc: `{"policy":"round_robin","federation":{"max_spill_fraction":0.1,"resume_spill_fraction":0.2}}`, err: "resume_spill_fraction"},
		{name: "breaker zero", doc: `{"policy":"round_robin","federation":{"breaker_failures":0}}`, err: "federation.breaker_failures"},
		{name: "stale zero", doc: `{"policy":"round_robin","federation":{"summary_stale":"0s"}}`, err: "federation.summary_stale"},
		{name: "unknown field", doc: `{"policy":"round_robin","federation":{"enable":true}}`, err: "unknown field"},
		{name: "unknown hcl attribute", doc: "policy = \"round_robin\"\nfederation {\n enable = true\n}\n", err: "enable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse([]byte(tc.doc), reg)
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, d.FederationSettings())
		})
	}
}
