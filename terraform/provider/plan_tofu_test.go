package provider

import (
	"context"
	"os"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/tofutest"
)

// TestPlanValidation runs the real tofu CLI with the provider: a bad
// engine/offload combination, count or variable fails `tofu plan` naming
// the attribute, with no cluster behind the provider. OASIS_TF_PROVIDER_BIN
// names a prebuilt provider; unset, the test builds one.
func TestPlanValidation(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the provider and runs tofu")
	}
	ctx := context.Background()
	tf := tofutest.New(t, tofutest.Options{Module: "testdata/plan", Provider: os.Getenv("OASIS_TF_PROVIDER_BIN"), WithProvider: true})
	tf.Init(ctx)

	p, err := tf.Plan(ctx)
	must.NoError(t, err)
	must.Len(t, 2, p.Changed())
	for _, c := range p.Changed() {
		must.Eq(t, []string{"create"}, c.Change.Actions)
	}

	// driver_policy stating that the clients allow task binaries lets engine_binary through.
	p, err = tf.Plan(ctx, "-var", "engine_binary=/opt/vllm/bin/vllm", "-var", "allow_task_binary=true")
	must.NoError(t, err)
	must.Len(t, 2, p.Changed())

	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		{"hicache on vllm", []string{"-var", "kv_offload=hicache"},
			[]string{"kv_offload: \"hicache\" is not supported by engine vllm", "kv_offload = var.kv_offload"}},
		{"unknown engine", []string{"-var", "engine=tgi"},
			[]string{"engine: unknown engine \"tgi\"", "engine = var.engine"}},
		{"nixl on whole engines", []string{"-var", "kv_offload=nixl"},
			[]string{"role: \"both\" is not supported by engine vllm with kv_offload \"nixl\""}},
		{"negative count", []string{"-var", "engine_count=-1"},
			[]string{"engine_count: must not be negative"}},
		{"unknown router variable", []string{"-var", `router_variables={htp_port="80"}`},
			[]string{`router_variables["htp_port"]`, `declares no variable "htp_port"`}},
		{"mistyped router variable", []string{"-var", `router_variables={http_port="eighty"}`},
			[]string{`router_variables["http_port"]`, "not a number"}},
		// The provider's driver_policy defaults to the llm plugin's: no task binaries.
		{"engine binary under the default policy", []string{"-var", "engine_binary=/opt/vllm/bin/vllm"},
			[]string{`engine_binary: llm driver field binary: "/opt/vllm/bin/vllm"`, "allow_task_binary = true", "engine_binary = var.engine_binary"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := tf.Plan(ctx, tc.args...)
			must.Error(t, err)
			// tofu wraps messages and aligns attributes: compare words.
			got := strings.Join(strings.Fields(err.Error()), " ")
			for _, w := range tc.want {
				must.StrContains(t, got, strings.Join(strings.Fields(w), " "))
			}
		})
	}
}
