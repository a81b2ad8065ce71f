package provider

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tofutest"
	"github.com/oasis-llm/oasis/router/policy"
)

func TestValidatePolicy(t *testing.T) {
	def, err := json.Marshal(policy.Default())
	must.NoError(t, err)
	for _, tc := range []struct {
		name, doc, err string // err "": valid
	}{
		{"router default", string(def), ""},
		{"all terms", `{"policy":"weighted","weights":{"ttft":2,"prefix":1,"load":0.2,"power":1.3,"kv_capacity":0.5}}`, ""},
		{"round robin with a model", `{"policy":"round_robin","models":{"m":{"policy":"least_load","admission":{"max_in_flight":4}}}}`, ""},
		{"hcl", "policy = \"weighted\"\nweights = { load = 1 }\nmodel \"m\" {\n  policy = \"round_robin\"\n}\n", ""},
		{"model weight", `{"policy":"weighted","weights":{"load":1},"models":{"x":{"weights":{"load":-1}}}}`, "models.x.weights.load: must be a finite number ≥ 0"},
		{"unknown term", `{"policy":"weighted","weights":{"lod":1}}`, `weights: unknown term "lod"`},
		{"unknown policy", `{"policy":"kv_aware"}`, `policy: unknown "kv_aware"`},
		{"unknown field", `{"policy":"round_robin","weigths":{}}`, `unknown field "weigths"`},
		{"bad timeout", `{"policy":"round_robin","timeouts":{"stream_idle":"soon"}}`, "timeouts.stream_idle"},
		{"bad admission", `{"policy":"round_robin","admission":{"max_queue":-1}}`, "admission.max_queue: must be ≥ 0"},
		{"trailing data", `{"policy":"round_robin"} {}`, "data after the document"},
		{"hcl unknown block", "policy = \"round_robin\"\nadmision {}\n", "admision"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validatePolicy(tc.doc)
			if tc.err == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, tc.err)
		})
	}
}

// The router_policy lifecycle through tofu: adopt the router's default
// document, refresh out-of-band edits and deletes into the plan, refuse a
// stale update, import by key, destroy, and fail plan on a bad document.
func (b *testBed) testRouterPolicy(t *testing.T) {
	ctx := context.Background()
	const prefix = "t/policy"
	key := prefix + "/policy"
	// A router started before: its default document is there to adopt.
	def, err := json.MarshalIndent(policy.Default(), "", "  ")
	must.NoError(t, err)
	kvPut(t, b.consul, key, def)

	tf := b.tofu(t, "testdata/policy", prefix)
	tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	var doc string
	var index int64
	must.NoError(t, tf.Output(ctx, "document", &doc))
	must.NoError(t, tf.Output(ctx, "modify_index", &index))
	pair := kvValue(t, b.consul, key)
	must.Eq(t, doc, string(pair.Value))
	must.Eq(t, uint64(index), pair.ModifyIndex)
	must.StrContains(t, doc, `"load":0.2`)

	p, err := tf.Plan(ctx)
	must.NoError(t, err)
	must.MapEmpty(t, addresses(p))

	// An out-of-band edit shows as an update of exactly this resource.
	kvPut(t, b.consul, key, def)
	p, err = tf.Plan(ctx)
	must.NoError(t, err)
	must.Eq(t, map[string][]string{"oasis_router_policy.p": {"update"}}, addresses(p))

	// A write based on a stale index fails and names the cause.
	_, err = tf.Run(ctx, "apply", "-auto-approve", "-no-color", "-refresh=false", "-var", "load=0.3")
	must.ErrorContains(t, err, "changed since the last refresh")
	must.Eq(t, def, kvValue(t, b.consul, key).Value)

	tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	must.Eq(t, doc, string(kvValue(t, b.consul, key).Value))

	// An out-of-band delete: the plan creates the document again.
	_, err = b.consul.KV().Delete(key, nil)
	must.NoError(t, err)
	p, err = tf.Plan(ctx)
	must.NoError(t, err)
	must.Eq(t, map[string][]string{"oasis_router_policy.p": {"create"}}, addresses(p))
	must.Eq(t, any(key), p.Changed()[0].Change.After["key"]) // known at plan time
	tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	must.Eq(t, doc, string(kvValue(t, b.consul, key).Value))

	// Import by key: the state matches the configuration again.
	tf.Must(ctx, "state", "rm", "oasis_router_policy.p")
	tf.Must(ctx, "import", "-no-color", "oasis_router_policy.p", key)
	p, err = tf.Plan(ctx)
	must.NoError(t, err)
	must.MapEmpty(t, addresses(p))

	// A bad document fails plan, naming the field.
	_, err = tf.Run(ctx, "plan", "-no-color", "-var", `models={x={weights={load=-1}}}`)
	must.ErrorContains(t, err, "document: models.x.weights.load: must be a finite number")

	tf.Must(ctx, "destroy", "-auto-approve", "-no-color")
	must.Nil(t, kvValue(t, b.consul, key))

	// With a router's watcher running, a destroy gives the routers the
	// default document back, which the next create adopts.
	tf.Must(ctx, "apply", "-auto-approve", "-no-color")
	stop := b.runPolicyWatcher(t, key)
	defer stop()
	tf.Must(ctx, "destroy", "-auto-approve", "-no-color")
	testutil.Eventually(t, 10*time.Second, "the router's default policy", func() bool {
		pair := kvValue(t, b.consul, key)
		return pair != nil && string(pair.Value) == string(def) // what writeDefault writes
	})
	p, err = tf.Plan(ctx)
	must.NoError(t, err)
	must.Eq(t, map[string][]string{"oasis_router_policy.p": {"create"}}, addresses(p))
}

// runPolicyWatcher runs the router's policy watcher on key until stop.
func (b *testBed) runPolicyWatcher(t *testing.T, key string) (stop func()) {
	t.Helper()
	reg, err := policyTerms()
	must.NoError(t, err)
	w, err := policy.NewWatcher(policy.WatcherConfig{Client: b.consul, Key: key, Terms: reg, WaitTime: 5 * time.Second})
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	return func() { cancel(); <-done }
}

// The tests install the provider into a mirror laid out by tofutest's copy
// of the address and version.
func TestMirrorMatchesProvider(t *testing.T) {
	must.EqOp(t, Address, tofutest.ProviderAddress)
	must.EqOp(t, DefaultVersion, tofutest.ProviderVersion)
}
