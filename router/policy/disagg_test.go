package policy

import (
	"testing"

	"github.com/shoenig/test/must"
)

var defaultDisagg = DisaggPolicy{Enabled: true, MinUncachedTokens: DefaultDisaggMinUncachedTokens, Fallback: true}

func TestDisaggValidation(t *testing.T) {
	cases := []struct {
		name, doc, err string
	}{
		{"json fields", `{"policy":"round_robin","disaggregation":"off","disaggregation_min_uncached_tokens":0,
			"disaggregation_fallback":"none","models":{"x":{"disaggregation":"auto"}}}`, ""},
		{"bad mode", `{"policy":"round_robin","disaggregation":"on"}`, `disaggregation: want "auto" or "off", got "on"`},
		{"negative threshold", `{"policy":"round_robin","models":{"x":{"disaggregation_min_uncached_tokens":-1}}}`,
			"models.x.disaggregation_min_uncached_tokens: must be between 0 and 2147483647"},
		{"huge threshold", `{"policy":"round_robin","disaggregation_min_uncached_tokens":4294967296}`,
			"disaggregation_min_uncached_tokens: must be between"},
		{"bad fallback", `{"policy":"round_robin","models":{"x":{"disaggregation_fallback":"decode"}}}`,
			`models.x.disaggregation_fallback: want "local" or "none"`},
		{"wrong type", `{"policy":"round_robin","disaggregation_min_uncached_tokens":"many"}`, "decoding policy JSON"},
		{"unknown field", `{"policy":"round_robin","disaggregation_threshold":1}`, `unknown field "disaggregation_threshold"`},
		{"hcl", `policy = "round_robin"
disaggregation = "auto"
disaggregation_min_uncached_tokens = 512
model "x" {
  disaggregation_fallback = "none"
}`, ""},
		{"hcl only disaggregation", `disaggregation = "off"`, "policy: missing"},
		{"hcl bad mode", `policy = "round_robin"
model "x" {
  disaggregation = "maybe"
}`, "models.x.disaggregation: want"},
		{"hcl unknown", `policy = "round_robin"
disaggregation_treshold = 3`, "disaggregation_treshold"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), registry(t))
			if tc.err == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, tc.err)
		})
	}
}

func TestDisaggFor(t *testing.T) {
	for _, doc := range []string{
		`{"policy":"round_robin","disaggregation_min_uncached_tokens":1000,
		  "models":{"off":{"disaggregation":"off"},"strict":{"disaggregation_fallback":"none","disaggregation_min_uncached_tokens":0}}}`,
		`policy = "round_robin"
disaggregation_min_uncached_tokens = 1000
model "off" {
  disaggregation = "off"
}
model "strict" {
  disaggregation_fallback = "none"
  disaggregation_min_uncached_tokens = 0
}`,
	} {
		d, err := Parse([]byte(doc), registry(t))
		must.NoError(t, err)
		must.Eq(t, DisaggPolicy{Enabled: true, MinUncachedTokens: 1000, Fallback: true}, d.For("other").Disagg)
		must.Eq(t, DisaggPolicy{Enabled: false, MinUncachedTokens: 1000, Fallback: true}, d.For("off").Disagg)
		must.Eq(t, DisaggPolicy{Enabled: true, MinUncachedTokens: 0, Fallback: false}, d.For("strict").Disagg)
	}
	must.Eq(t, defaultDisagg, Default().For("m").Disagg)
}
