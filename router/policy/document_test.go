package policy

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/scoring"
)

// registry holds the terms the router registers (cmd/oasis-router): the built-in ones, prefix and ttft.
func registry(t *testing.T) *scoring.Registry {
	r, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.CacheTerms(nil)...)...)
	must.NoError(t, err)
	return r
}

func TestParse(t *testing.T) {
	cases := []struct {
		name string
		doc  string
		err  string
	}{
		{"minimal", `{"policy":"round_robin"}`, ""},
		{"full", `{"policy":"weighted","weights":{"load":1,"power":0.5},"admission":{"max_in_flight":8,"max_queue":4,"queue_timeout":"2s"},
			"models":{"a":{"policy":"least_load"},"b":{"weights":{"kv_capacity":1}},"c":{"admission":{"max_queue":0}}}}`, ""},
		{"neither JSON nor HCL", `policy: weighted`, "decoding policy HCL"},
		{"broken JSON", `{"policy":`, "decoding policy JSON"},
		{"unknown field", `{"policy":"round_robin","wieghts":{}}`, `unknown field "wieghts"`},
		{"trailing data", `{"policy":"round_robin"} {}`, "data after"},
		{"unknown policy", `{"policy":"random"}`, `unknown "random"`},
		{"unknown term", `{"policy":"weighted","weights":{"prefx":1}}`, `unknown term "prefx"`},
		{"ttft term", `{"policy":"weighted","weights":{"ttft":2,"prefix":1,"load":0.5}}`, ""},
		{"negative ttft weight", `{"policy":"weighted","weights":{"ttft":-1,"load":1}}`, "weights.ttft: must be a finite number ≥ 0"},
		{"model ttft only", `{"policy":"round_robin","models":{"x":{"policy":"weighted","weights":{"ttft":1}}}}`, ""},
		{"negative in-flight", `{"policy":"round_robin","admission":{"max_in_flight":-1}}`, "admission.max_in_flight"},
		{"bad timeout", `{"policy":"round_robin","admission":{"queue_timeout":"soon"}}`, "admission.queue_timeout"},
		{"model bad policy", `{"policy":"round_robin","models":{"x":{"policy":"fast"}}}`, "models.x.policy"},
		{"model weighted inherits no weights", `{"policy":"round_robin","models":{"x":{"policy":"weighted"}}}`, "models.x.weights"},
		{"model bad admission", `{"policy":"round_robin","models":{"x":{"admission":{"max_queue":-3}}}}`, "models.x.admission.max_queue"},
		{"empty model name", `{"policy":"round_robin","models":{"":{}}}`, "empty model name"},
		{"timeouts", `{"policy":"round_robin","timeouts":{"response_header":"2m","stream_idle":"5s","first_token_hold":"auto"},
			"models":{"x":{"timeouts":{"first_token_hold":"0s"}}}}`, ""},
		{"zero stream idle", `{"policy":"round_robin","timeouts":{"stream_idle":"0s"}}`, "timeouts.stream_idle: want a duration > 0"},
		{"bad header timeout", `{"policy":"round_robin","timeouts":{"response_header":"later"}}`, "timeouts.response_header"},
		{"bad hold", `{"policy":"round_robin","models":{"x":{"timeouts":{"first_token_hold":"-1s"}}}}`, "models.x.timeouts.first_token_hold"},
		{"unknown timeout", `{"policy":"round_robin","timeouts":{"idle":"1s"}}`, `unknown field "idle"`},
		{"migration limit", `{"policy":"round_robin","migration_limit":0,"models":{"x":{"migration_limit":5}}}`, ""},
		{"negative migration limit", `{"policy":"round_robin","migration_limit":-1}`, "migration_limit: want 0 (off) to 16, got -1"},
		{"model migration limit too high", `{"policy":"round_robin","models":{"x":{"migration_limit":17}}}`, "models.x.migration_limit: want 0 (off) to 16"},
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

var defaults = UpstreamTimeouts{ResponseHeader: DefaultResponseHeaderTimeout, StreamIdle: DefaultStreamIdleTimeout, HoldAuto: true}

func TestTimeoutsFor(t *testing.T) {
	doc, err := Parse([]byte(`{"policy":"round_robin","timeouts":{"stream_idle":"5s","first_token_hold":"2s"},
		"models":{"a":{"timeouts":{"response_header":"1m"}},"b":{"timeouts":{"first_token_hold":"auto"}}}}`), registry(t))
	must.NoError(t, err)
	base := UpstreamTimeouts{ResponseHeader: DefaultResponseHeaderTimeout, StreamIdle: 5 * time.Second, FirstTokenHold: 2 * time.Second}
	a := base
	a.ResponseHeader = time.Minute
	b := base
	b.FirstTokenHold, b.HoldAuto = 0, true
	must.Eq(t, base, doc.For("other").Timeouts)
	must.Eq(t, a, doc.For("a").Timeouts)
	must.Eq(t, b, doc.For("b").Timeouts)
}

func TestFor(t *testing.T) {
	doc, err := Parse([]byte(`{"policy":"weighted","weights":{"load":1},
		"admission":{"max_in_flight":8,"max_queue":4,"queue_timeout":"2s"},
		"models":{"a":{"policy":"least_load","admission":{"max_in_flight":2}},"b":{"weights":{"power":1}}}}`), registry(t))
	must.NoError(t, err)
	cases := []struct {
		model string
		want  Resolved
	}{
		{"other", Resolved{scoring.Config{Policy: "weighted", Weights: map[string]float64{"load": 1}}, Limits{8, 4, 2 * time.Second}, defaults, defaultDisagg, DefaultMigrationLimit}},
		{"a", Resolved{scoring.Config{Policy: "least_load", Weights: map[string]float64{"load": 1}}, Limits{2, 4, 2 * time.Second}, defaults, defaultDisagg, DefaultMigrationLimit}},
		{"b", Resolved{scoring.Config{Policy: "weighted", Weights: map[string]float64{"power": 1}}, Limits{8, 4, 2 * time.Second}, defaults, defaultDisagg, DefaultMigrationLimit}},
	}
	for _, tc := range cases {
		t.Run(tc.model, func(t *testing.T) { must.Eq(t, tc.want, doc.For(tc.model)) })
	}
}

func TestMigrationLimitFor(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		want      map[string]int
	}{
		{"default", `{"policy":"round_robin","models":{"a":{}}}`, map[string]int{"a": DefaultMigrationLimit, "b": DefaultMigrationLimit}},
		{"document off", `{"policy":"round_robin","migration_limit":0,"models":{"a":{"migration_limit":3}}}`, map[string]int{"a": 3, "b": 0}},
		{"hcl", "policy = \"round_robin\"\nmigration_limit = 1\nmodel \"a\" {\n  migration_limit = 0\n}\n", map[string]int{"a": 0, "b": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			doc, err := Parse([]byte(tc.doc), registry(t))
			must.NoError(t, err)
			for model, n := range tc.want {
				must.EqOp(t, n, doc.For(model).MigrationLimit, must.Sprint(model))
			}
		})
	}
}

func TestDefaultIsValid(t *testing.T) {
	data, err := json.Marshal(Default())
	must.NoError(t, err)
	doc, err := Parse(data, registry(t))
	must.NoError(t, err)
	must.Eq(t, scoring.Weighted, doc.Policy)
	must.Eq(t, Limits{0, 1024, 30 * time.Second}, doc.For("x").Limits)
}

func TestParseHCL(t *testing.T) {
	hcl := `
policy  = "weighted"
weights = { load = 1, power = 0.5 }
admission {
  max_in_flight = 8
  max_queue     = 4
  queue_timeout = "2s"
}
model "a" {
  policy = "least_load"
  admission { max_in_flight = 2 }
}
model "b" {
  weights = { kv_capacity = 1 }
  timeouts { stream_idle = "3s" }
}
timeouts {
  response_header = "2m"
  first_token_hold = "0s"
}
`
	json := `{"policy":"weighted","weights":{"load":1,"power":0.5},
		"admission":{"max_in_flight":8,"max_queue":4,"queue_timeout":"2s"},
		"timeouts":{"response_header":"2m","first_token_hold":"0s"},
		"models":{"a":{"policy":"least_load","admission":{"max_in_flight":2}},"b":{"weights":{"kv_capacity":1},"timeouts":{"stream_idle":"3s"}}}}`
	fromHCL, err := Parse([]byte(hcl), registry(t))
	must.NoError(t, err)
	fromJSON, err := Parse([]byte(json), registry(t))
	must.NoError(t, err)
	for _, m := range []string{"a", "b", "other"} {
		must.Eq(t, fromJSON.For(m), fromHCL.For(m))
	}

	cases := []struct{ name, doc, err string }{
		{"unknown attribute", "policy = \"round_robin\"\nwieghts = { load = 1 }\n", "wieghts"},
		{"unknown block", "policy = \"round_robin\"\nmodels \"x\" {}\n", "models"},
		{"invalid policy", "policy = \"fastest\"\n", `unknown "fastest"`},
		{"bad model", "policy = \"round_robin\"\nmodel \"x\" {\n  weights = { nope = 1 }\n  policy = \"weighted\"\n}\n", "models.x.weights"},
		{"duplicate model", "policy = \"round_robin\"\nmodel \"x\" {}\nmodel \"x\" {}\n", "defined twice"},
		{"syntax", "policy = \n", "decoding policy HCL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.doc), registry(t))
			must.ErrorContains(t, err, tc.err)
		})
	}
}
