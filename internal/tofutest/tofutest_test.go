package tofutest

import (
	"context"
	"testing"

	"github.com/shoenig/test/must"
)

// The mirror is the only source of the Oasis provider, and init takes it
// from there without a registry.
func TestInitFromMirror(t *testing.T) {
	ctx := context.Background()
	tf := New(t, Options{Module: "testdata/provider-only", WithProvider: true})
	tf.Init(ctx)
	out := tf.Must(ctx, "providers", "-no-color")
	must.StrContains(t, out, "provider[registry.opentofu.org/oasis-llm/oasis]")
	p, err := tf.Plan(ctx)
	must.NoError(t, err)
	must.SliceEmpty(t, p.Changed())
}

// Without the mirror, a module that needs the provider fails init: nothing
// reaches a registry.
func TestInitWithoutMirrorFails(t *testing.T) {
	tf := New(t, Options{Module: "testdata/provider-only"})
	_, err := tf.Run(context.Background(), "init", "-no-color")
	must.ErrorContains(t, err, "oasis-llm/oasis")
}
