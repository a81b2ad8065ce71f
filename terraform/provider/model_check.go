package provider

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/hashicorp/terraform-plugin-framework/path"

	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/oasis-llm/oasis/nomad-driver/jobcheck"
	"github.com/oasis-llm/oasis/nomad-driver/tiers"
)

// problem is one plan-time finding about an oasis_model, on the attribute
// it is about (an empty path: the resource as a whole).
type problem struct {
	Path path.Path
	Msg  string
}

// driverFieldAttr maps the llm driver's task config fields onto the
// oasis_model attributes they are rendered from. Fields the renderer fills
// on its own (port labels) are absent: a finding there is the resource's.
var driverFieldAttr = map[string]string{
	"engine":                 "engine",
	"model":                  "model",
	"served_model_name":      "name",
	"role":                   "role",
	"kv_offload":             "kv_offload",
	"kv_offload_size_gb":     "kv_offload_size_gb",
	"kv_offload_tier":        "kv_offload_tier",
	"tensor_parallel_size":   "tensor_parallel_size",
	"max_model_len":          "max_model_len",
	"gpu_memory_utilization": "gpu_memory_utilization",
	"block_size":             "block_size",
	"extra_args":             "extra_args",
	"binary":                 "engine_binary",
	"image":                  "engine_image",
}

// modelNameRE is what a served model name may be: it is also part of a
// Nomad job id and a Consul meta value.
var modelNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$`)

// checkModel finds everything wrong with a spec: its own attributes first,
// then the rendered job through the llm driver's own validation and
// rendering (jobcheck) against the clients' plugin policy, each driver
// field mapped back to its attribute.
// A kv_offload_tier is read only where the provider has clients (ModifyPlan,
// checkModelTiers); elsewhere the rest is checked and the tier is not.
func checkModel(s modelSpec, policy config.Policy) []problem {
	return checkModelTiers(context.Background(), s, policy, nil)
}

// checkModelTiers is checkModel reading kv_offload_tier from src.
func checkModelTiers(ctx context.Context, s modelSpec, policy config.Policy, src tiers.Source) []problem {
	ps := checkSpecAttrs(s)
	if len(ps) > 0 {
		return ps
	}
	seen := map[string]bool{}
	for _, r := range jobcheck.CheckWith(ctx, renderModelJob(s), jobcheck.Options{Policy: policy, Tiers: src}) {
		var unchecked *jobcheck.TierUncheckedError
		if errors.As(r.Err, &unchecked) {
			continue
		}
		for _, err := range flattenErrors(r.Err) {
			p := driverProblem(err)
			if !seen[p.Path.String()+p.Msg] {
				seen[p.Path.String()+p.Msg] = true
				ps = append(ps, p)
			}
		}
	}
	return ps
}

// tiers is where oasis_model s's kv_offload_tier is read at plan time: the
// Nomad variables of the provider's cluster, with its token (nil: unchecked).
func (c *Clients) tiers(s modelSpec) tiers.Source {
	if c == nil || c.Nomad == nil || s.KVOffloadTier == "" {
		return nil
	}
	return tiers.Nomad{Client: c.Nomad, Namespace: s.Namespace}
}

// unconfiguredPolicy stands in for the clients' policy where the provider
// is not configured yet (ValidateConfig, `tofu validate`): it allows what a
// plugin config may allow, so that only ModifyPlan, which has the
// provider's driver_policy, refuses what the policy refuses.
var unconfiguredPolicy = config.Policy{AllowTaskBinary: true, DefaultUser: "root"}

// policyOf is the policy oasis_model is checked against with clients c.
func policyOf(c *Clients) config.Policy {
	if c == nil {
		return unconfiguredPolicy
	}
	return c.DriverPolicy
}

// checkSpecAttrs checks what the driver cannot see: names, role and counts,
// resources.
func checkSpecAttrs(s modelSpec) []problem {
	var ps []problem
	add := func(attr, format string, args ...any) {
		ps = append(ps, problem{Path: path.Root(attr), Msg: fmt.Sprintf(format, args...)})
	}
	if !modelNameRE.MatchString(s.Name) {
		add("name", "%q is not a model name: 1-100 letters, digits, '.', '_' or '-', starting with a letter or digit (it is the served model name and part of the Nomad job id)", s.Name)
	}
	if s.Engine == config.EngineOpenAICompat {
		add("engine", "openai_compat runs no engine process; oasis_model deploys engines (allowed: %s)",
			strings.Join(slices.DeleteFunc(slices.Clone(config.Engines), func(e string) bool { return e == config.EngineOpenAICompat }), ", "))
	}
	switch s.Role {
	case modelRoleBoth:
		if s.Count < 0 {
			add("engine_count", "must not be negative, got %d", s.Count)
		}
	case modelRoleDisaggregated:
		if s.PrefillCount < 0 {
			add("prefill_count", "must not be negative, got %d", s.PrefillCount)
		}
		if s.DecodeCount < 0 {
			add("decode_count", "must not be negative, got %d", s.DecodeCount)
		}
	default:
		add("role", "unknown role %q; allowed: %s, %s", s.Role, modelRoleBoth, modelRoleDisaggregated)
	}
	if s.CPU < 1 {
		ps = append(ps, problem{path.Root("resources").AtName("cpu"), fmt.Sprintf("must be at least 1 MHz, got %d", s.CPU)})
	}
	if s.MemoryMB < 10 {
		ps = append(ps, problem{path.Root("resources").AtName("memory"), fmt.Sprintf("must be at least 10 MiB (Nomad's minimum), got %d", s.MemoryMB)})
	}
	if s.GPUs != nil && *s.GPUs < 0 {
		ps = append(ps, problem{path.Root("resources").AtName("gpus"), fmt.Sprintf("must not be negative, got %d", *s.GPUs)})
	}
	if len(s.Datacenters) == 0 {
		add("datacenters", "must name at least one datacenter (\"*\" for all)")
	}
	return ps
}

// driverProblem maps one driver error onto its attribute.
func driverProblem(err error) problem {
	// A problem with the tier's declaration belongs to kv_offload_tier.
	var te *config.TierError
	if errors.As(err, &te) {
		return problem{Path: path.Root("kv_offload_tier"), Msg: strings.TrimPrefix(te.Error(), "kv_offload_tier: ")}
	}
	var fe *config.FieldError
	if !errors.As(err, &fe) {
		return problem{Msg: "llm driver: " + err.Error()}
	}
	if fe.Field == "tensor_parallel_size" && strings.Contains(fe.Msg, "GPU(s) reserved") {
		return problem{Path: path.Root("resources").AtName("gpus"), Msg: "llm driver field tensor_parallel_size: " + fe.Msg}
	}
	attr, ok := driverFieldAttr[fe.Field]
	if !ok {
		return problem{Msg: "llm driver field " + fe.Field + ": " + fe.Msg}
	}
	msg := fe.Msg
	if attr != fe.Field {
		msg = "llm driver field " + fe.Field + ": " + msg
	}
	return problem{Path: path.Root(attr), Msg: msg}
}

// flattenErrors unwraps errors.Join trees into their leaves.
func flattenErrors(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, flattenErrors(e)...)
		}
		return out
	}
	return []error{err}
}
