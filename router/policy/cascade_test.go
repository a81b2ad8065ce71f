package policy

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestCascadeOverflowValidation(t *testing.T) {
	cases := []struct {
		name, doc, err string
	}{
		{"json", `{"policy":"round_robin","cascades":{"assist":{"small":"s","large":"l","gate":"logprob","threshold":-0.5,"max_small_tokens":64}},
			"hosted_peers":false,"models":{"l":{"overflow":{"pool":"l-hosted","when":"ttft_over","ttft_seconds":2,"model":"gpt-x"},"hosted_peers":true}}}`, ""},
		{"no threshold", `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l"}}}`, "cascades.a.threshold: required"},
		{"no small", `{"policy":"round_robin","cascades":{"a":{"large":"l","threshold":-1}}}`, "cascades.a.small: required"},
		{"same", `{"policy":"round_robin","cascades":{"a":{"small":"l","large":"l","threshold":-1}}}`, "cascades.a.large: must differ"},
		{"bad gate", `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l","gate":"entropy","threshold":-1}}}`, `cascades.a.gate: want "logprob"`},
		{"positive threshold", `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l","threshold":0.5}}}`, "cascades.a.threshold: want a mean token log probability ≤ 0"},
		{"negative cap", `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l","threshold":-1,"max_small_tokens":-1}}}`, "cascades.a.max_small_tokens"},
		{"nested", `{"policy":"round_robin","cascades":{"a":{"small":"b","large":"l","threshold":-1},"b":{"small":"s","large":"l","threshold":-1}}}`, "cascades do not nest"},
		{"unknown cascade field", `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l","threshold":-1,"treshold":2}}}`, `unknown field "treshold"`},
		{"no pool", `{"policy":"round_robin","models":{"m":{"overflow":{"when":"queue_full"}}}}`, "models.m.overflow.pool: required"},
		{"self pool", `{"policy":"round_robin","models":{"m":{"overflow":{"pool":"m"}}}}`, "models.m.overflow.pool: must differ"},
		{"bad when", `{"policy":"round_robin","models":{"m":{"overflow":{"pool":"h","when":"always"}}}}`, `models.m.overflow.when: want "queue_full" or "ttft_over"`},
		{"ttft without seconds", `{"policy":"round_robin","models":{"m":{"overflow":{"pool":"h","when":"ttft_over"}}}}`, "models.m.overflow.ttft_seconds: want a number of seconds > 0"},
		{"seconds without ttft", `{"policy":"round_robin","models":{"m":{"overflow":{"pool":"h","ttft_seconds":3}}}}`, `models.m.overflow.ttft_seconds: only with when = "ttft_over"`},
		{"chained", `{"policy":"round_robin","models":{"m":{"overflow":{"pool":"h"}},"h":{"overflow":{"pool":"g"}}}}`, "overflow does not chain"},
		{"unknown overflow field", `{"policy":"round_robin","models":{"m":{"overflow":{"pool":"h","target":"x"}}}}`, `unknown field "target"`},
		{"hcl", `policy = "round_robin"
hosted_peers = false
cascade "assist" {
  small     = "s"
  large     = "l"
  threshold = -0.3
}
model "l" {
  hosted_peers = true
  overflow {
    pool  = "l-hosted"
    when  = "queue_full"
    model = "gpt-x"
  }
}`, ""},
		{"hcl only cascade", `cascade "a" {
  small = "s"
  large = "l"
  threshold = -1
}`, "policy: missing"},
		{"hcl missing threshold", `policy = "round_robin"
cascade "a" {
  small = "s"
  large = "l"
}`, `"threshold" is required`},
		{"hcl unknown", `policy = "round_robin"
model "m" {
  overflow {
    pool = "h"
    whenever = "x"
  }
}`, "whenever"},
		{"hcl bad when", `policy = "round_robin"
model "m" {
  overflow {
    pool = "h"
    when = "x"
  }
}`, "models.m.overflow.when"},
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

func TestCascadeOverflowResolve(t *testing.T) {
	d, err := Parse([]byte(`{"policy":"round_robin","hosted_peers":true,
		"cascades":{"assist":{"small":"s","large":"l","threshold":-0.5}},
		"models":{"l":{"overflow":{"pool":"l-hosted","when":"ttft_over","ttft_seconds":2}},"s":{"hosted_peers":false}}}`), registry(t))
	must.NoError(t, err)
	c, ok := d.CascadeFor("assist")
	must.True(t, ok)
	must.Eq(t, -0.5, c.ThresholdValue())
	must.Eq(t, "s", c.Small)
	_, ok = d.CascadeFor("l")
	must.False(t, ok)
	must.True(t, d.HostedPeersFor("assist"))
	must.False(t, d.HostedPeersFor("s"))
	o, ok := d.OverflowFor("l")
	must.True(t, ok)
	must.Eq(t, OverflowPolicy{Pool: "l-hosted", Model: "l-hosted", TTFTOver: true, TTFTSeconds: 2}, o)
	_, ok = d.OverflowFor("s")
	must.False(t, ok)
}
