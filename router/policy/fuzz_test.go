package policy

import (
	"encoding/json"
	"reflect"
	"testing"

	"github.com/oasis-llm/oasis/router/scoring"
)

// FuzzParse feeds arbitrary JSON and HCL policy documents (from Consul KV, so
// operator-written and untrusted) to Parse. Beyond never panicking, whatever
// Parse accepts must validate, re-encode to JSON and parse again to a document
// that resolves, for every model it names and for one it does not, to the same
// policy: the router stores and compares documents as JSON, so an HCL document
// that meant something different once in JSON would change routing on reload.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"policy":"round_robin"}`,
		`{"policy":"weighted","weights":{"ttft":2,"prefix":1,"load":0.2,"power":1.3},
		  "admission":{"max_in_flight":8,"max_queue":4,"queue_timeout":"2s"},
		  "timeouts":{"response_header":"5m","stream_idle":"60s","first_token_hold":"auto"},
		  "models":{"a":{"policy":"least_load"},"b":{"weights":{"kv_capacity":1}},
		            "c":{"admission":{"max_queue":0},"timeouts":{"first_token_hold":"0s"}}}}`,
		`{"policy":"round_robin","models":{"x":{"policy":"weighted","weights":{"ttft":1}}}}`,
		`{"policy":"round_robin"} {}`,
		`{"policy":"round_robin","weights":{}, "models":{"m":{"weights":{}}}}`,
		"policy = \"weighted\"\nweights = { ttft = 2, load = 0.5 }\n" +
			"admission {\n  max_in_flight = 16\n  queue_timeout = \"1s\"\n}\n" +
			"timeouts {\n  stream_idle = \"30s\"\n  first_token_hold = \"auto\"\n}\n" +
			"model \"llama\" {\n  policy = \"least_load\"\n  admission { max_queue = 3 }\n}\n",
		"policy = \"round_robin\"\nmodel \"a\" {}\nmodel \"a\" {}\n",
		"model \"\" { policy = \"least_load\" }\npolicy = \"round_robin\"\n",
		"policy = \"round_robin\"\nadmission { max_in_flight = 1.5 }\n",
		"policy: weighted",
		`{"policy":"round_robin","federation":{"enabled":true,"margin":"50ms","queue_wait_budget":"2s",
		  "max_spill_fraction":0.2,"resume_spill_fraction":0.1,"breaker_failures":5,
		  "breaker_cooldown":"10s","summary_stale":"3s"}}`,
		`{"policy":"round_robin","federation":{"max_spill_fraction":0.05}}`,
		"policy = \"round_robin\"\nfederation {\n  enabled = true\n  margin = \"0s\"\n  max_spill_fraction = 1\n}\n",
		`{"policy":"round_robin","hosted_peers":false,"cascades":{"a":{"small":"s","large":"l","threshold":-0.4,"max_small_tokens":8}},
		  "models":{"l":{"overflow":{"pool":"h","when":"ttft_over","ttft_seconds":1.5,"model":"x"},"hosted_peers":true}}}`,
		"policy = \"round_robin\"\ncascade \"a\" {\n  small = \"s\"\n  large = \"l\"\n  threshold = -1\n}\n" +
			"model \"l\" {\n  overflow {\n    pool = \"h\"\n  }\n}\n",
	} {
		f.Add([]byte(s))
	}
	reg, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.CacheTerms(nil)...)...)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := Parse(data, reg)
		if err != nil {
			if d != nil {
				t.Fatalf("Parse returned a document and an error %v", err)
			}
			return
		}
		if err := d.Validate(reg); err != nil {
			t.Fatalf("accepted document does not validate: %v", err)
		}
		js, err := json.Marshal(d)
		if err != nil {
			t.Fatalf("accepted document does not encode to JSON: %v", err)
		}
		d2, err := Parse(js, reg)
		if err != nil {
			t.Fatalf("re-encoded document %s does not parse: %v", js, err)
		}
		names := []string{"", "not-a-model-in-the-document"}
		for name := range d.Models {
			names = append(names, name)
		}
		for name := range d2.Models {
			if _, ok := d.Models[name]; !ok {
				t.Fatalf("model %q appeared in the round trip %s", name, js)
			}
		}
		if a, b := d.FederationSettings(), d2.FederationSettings(); a != b {
			t.Fatalf("federation resolves to %+v, after a JSON round trip (%s) to %+v", a, js, b)
		}
		if fs := d.FederationSettings(); fs.ResumeSpillFraction > fs.MaxSpillFraction || fs.BreakerFailures < 1 {
			t.Fatalf("accepted federation settings break their invariants: %+v", fs)
		}
		for name := range d.Cascades {
			names = append(names, name)
		}
		for _, name := range names {
			if a, b := routingExtras(d, name), routingExtras(d2, name); !reflect.DeepEqual(a, b) {
				t.Fatalf("model %q's cascade, overflow or hosted_peers is %+v, after a JSON round trip (%s) %+v", name, a, js, b)
			}
			if a, b := effective(d.For(name)), effective(d2.For(name)); !reflect.DeepEqual(a, b) {
				t.Fatalf("model %q resolves to %+v, after a JSON round trip (%s) to %+v", name, a, js, b)
			}
		}
	})
}

// effective drops what routing never reads: weights matter only to the
// weighted policy (which Validate requires to have one > 0). JSON's omitempty
// turns an empty weights map into none, so {"weights":{}} on a round_robin
// model would otherwise differ from the document without it while routing the
// same.
func effective(r Resolved) Resolved {
	if r.Scoring.Policy != scoring.Weighted {
		r.Scoring.Weights = nil
	}
	return r
}

// routingExtras is what a document says of name outside Resolved.
func routingExtras(d *Document, name string) []any {
	c, isAlias := d.CascadeFor(name)
	o, overflows := d.OverflowFor(name)
	return []any{isAlias, c.Small, c.Large, c.Gate, c.ThresholdValue(), c.MaxSmallTokens, overflows, o, d.HostedPeersFor(name)}
}
