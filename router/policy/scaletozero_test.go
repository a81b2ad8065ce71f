package policy

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

func TestScaleToZeroValidation(t *testing.T) {
	cases := []struct {
		name, doc, err string
	}{
		{"json", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":"90s","max_held":8}}}}`, ""},
		{"json defaults", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{}}}}`, ""},
		{"bad hold", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":"soon"}}}}`, `models.m.scale_to_zero.hold: want a duration from 1s to 15m0s like "60s", got "soon"`},
		{"short hold", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":"500ms"}}}}`, "models.m.scale_to_zero.hold"},
		{"long hold", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":"1h"}}}}`, "models.m.scale_to_zero.hold"},
		{"no held", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"max_held":0}}}}`, "models.m.scale_to_zero.max_held: want 1 to 4096, got 0"},
		{"too many held", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"max_held":100000}}}}`, "models.m.scale_to_zero.max_held: want 1 to 4096"},
		{"unknown field", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":"60s","idle":"5m"}}}}`, `unknown field "idle"`},
		{"hcl", `policy = "round_robin"
model "m" {
  scale_to_zero {
    hold     = "2m"
    max_held = 16
  }
}`, ""},
		{"hcl bad hold", `policy = "round_robin"
model "m" {
  scale_to_zero {
    hold = "0s"
  }
}`, "models.m.scale_to_zero.hold"},
		{"hcl unknown", `policy = "round_robin"
model "m" {
  scale_to_zero {
    min = 0
  }
}`, `"min"`},
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

func TestScaleToZeroResolve(t *testing.T) {
	cases := []struct {
		name, doc string
		want      ColdStartPolicy
		ok        bool
	}{
		{"set", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{"hold":"90s","max_held":8}}}}`,
			ColdStartPolicy{Hold: 90 * time.Second, MaxHeld: 8}, true},
		{"defaults", `{"policy":"round_robin","models":{"m":{"scale_to_zero":{}}}}`,
			ColdStartPolicy{Hold: DefaultColdStartHold, MaxHeld: DefaultColdStartMaxHeld}, true},
		{"model without", `{"policy":"round_robin","models":{"m":{"policy":"least_load"}}}`, ColdStartPolicy{}, false},
		{"no model", `{"policy":"round_robin"}`, ColdStartPolicy{}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d, err := Parse([]byte(tc.doc), registry(t))
			must.NoError(t, err)
			got, ok := d.ColdStartFor("m")
			must.Eq(t, tc.ok, ok)
			must.Eq(t, tc.want, got)
		})
	}
}
