package provider

import (
	"context"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

func TestCheckModel(t *testing.T) {
	base := func() modelSpec {
		return modelSpec{Name: "m", Datacenters: []string{"*"}, Engine: "vllm", Model: "org/m",
			Role: modelRoleBoth, Count: 1, CPU: 500, MemoryMB: 1024}
	}
	cases := []struct {
		name     string
		edit     func(*modelSpec)
		attr     string // the attribute path the problem is on
		contains string
	}{
		{"unknown engine", func(s *modelSpec) { s.Engine = "tgi" }, "engine", "unknown engine"},
		{"openai_compat", func(s *modelSpec) { s.Engine = "openai_compat" }, "engine", "runs no engine process"},
		{"hicache on vllm", func(s *modelSpec) { s.KVOffload = "hicache" }, "kv_offload", "not supported by engine vllm"},
		{"native on sglang", func(s *modelSpec) { s.Engine = "sglang"; s.KVOffload = "native"; s.KVOffloadSizeGB = 8 }, "kv_offload", "hicache"},
		{"nixl without disaggregation", func(s *modelSpec) { s.KVOffload = "nixl" }, "role", "prefill or decode"},
		{"lmcache on disaggregated sglang", func(s *modelSpec) {
			s.Engine, s.Role, s.KVOffload = "sglang", modelRoleDisaggregated, "lmcache"
		}, "role", "not supported by engine sglang"},
		{"disaggregated llama_cpp", func(s *modelSpec) {
			s.Engine, s.Role, s.GPUs = "llama_cpp", modelRoleDisaggregated, ptr(0)
		}, "kv_offload", "not supported by engine llama_cpp"},
		{"native without size", func(s *modelSpec) { s.KVOffload = "native" }, "kv_offload_size_gb", "needs the CPU cache size"},
		{"size without offload", func(s *modelSpec) { s.KVOffloadSizeGB = 4 }, "kv_offload_size_gb", "offloads nothing"},
		{"negative count", func(s *modelSpec) { s.Count = -1 }, "engine_count", "negative"},
		{"negative decode count", func(s *modelSpec) { s.Role = modelRoleDisaggregated; s.DecodeCount = -2 }, "decode_count", "negative"},
		{"unknown role", func(s *modelSpec) { s.Role = "prefill" }, "role", "allowed: both, disaggregated"},
		{"zero cpu", func(s *modelSpec) { s.CPU = 0 }, "resources.cpu", "at least 1"},
		{"tiny memory", func(s *modelSpec) { s.MemoryMB = 4 }, "resources.memory", "at least 10"},
		{"negative gpus", func(s *modelSpec) { s.GPUs = ptr(-1) }, "resources.gpus", "negative"},
		{"fewer gpus than ranks", func(s *modelSpec) { s.TensorParallelSize = 4; s.GPUs = ptr(2) }, "resources.gpus", "tensor_parallel_size"},
		{"gpu utilization above 1", func(s *modelSpec) { s.GPUMemoryUtilization = 1.5 }, "gpu_memory_utilization", "(0, 1]"},
		{"tensor parallel llama_cpp", func(s *modelSpec) { s.Engine = "llama_cpp"; s.TensorParallelSize = 2 }, "tensor_parallel_size", "llama_cpp"},
		{"block size not a power of two", func(s *modelSpec) { s.BlockSize = 24 }, "block_size", "powers of two"},
		{"bad name", func(s *modelSpec) { s.Name = "a b" }, "name", "not a model name"},
		{"no model", func(s *modelSpec) { s.Model = " " }, "model", "required"},
		{"no datacenters", func(s *modelSpec) { s.Datacenters = nil }, "datacenters", "at least one"},
		// The llm driver's default policy: the clients' binaries map chooses the executable.
		{"engine binary", func(s *modelSpec) { s.EngineBinary = "/bin/sh" }, "engine_binary", "allow_task_binary = true"},
		{"engine image malformed", func(s *modelSpec) { s.EngineImage = "Not An Image" }, "engine_image", "not an image reference"},
		{"engine binary and image", func(s *modelSpec) { s.EngineBinary, s.EngineImage = "/opt/vllm", "vllm/vllm-openai:v0.11.2" }, "engine_binary", "exclusive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.edit(&s)
			ps := checkModel(s, config.DefaultPolicy())
			must.SliceNotEmpty(t, ps)
			var found bool
			for _, p := range ps {
				if p.Path.String() == tc.attr && strings.Contains(p.Msg, tc.contains) {
					found = true
				}
			}
			must.True(t, found, must.Sprintf("want a problem on %s containing %q, got %+v", tc.attr, tc.contains, ps))
		})
	}
}

func TestCheckModelValid(t *testing.T) {
	for name, s := range map[string]modelSpec{
		"sim disaggregated": {Name: "m", Datacenters: []string{"*"}, Engine: "sim", Model: "m",
			Role: modelRoleDisaggregated, PrefillCount: 1, DecodeCount: 1, CPU: 100, MemoryMB: 64},
		"vllm kvcached": {Name: "m", Datacenters: []string{"*"}, Engine: "vllm", Model: "m",
			Role: modelRoleBoth, Count: 1, KVOffload: "kvcached", CPU: 100, MemoryMB: 64},
		"sglang hicache": {Name: "m", Datacenters: []string{"*"}, Engine: "sglang", Model: "m",
			Role: modelRoleBoth, Count: 1, KVOffload: "hicache", KVOffloadSizeGB: 32, CPU: 100, MemoryMB: 64},
		"trtllm": {Name: "m", Datacenters: []string{"*"}, Engine: "trtllm", Model: "m",
			Role: modelRoleBoth, Count: 0, CPU: 100, MemoryMB: 64, TensorParallelSize: 2},
		"vllm from a pinned image": {Name: "m", Datacenters: []string{"*"}, Engine: "vllm", Model: "m",
			Role: modelRoleBoth, Count: 1, CPU: 100, MemoryMB: 64,
			EngineImage: "vllm/vllm-openai:v0.11.2@sha256:" + strings.Repeat("ab", 32)},
	} {
		t.Run(name, func(t *testing.T) { must.SliceEmpty(t, checkModel(s, config.DefaultPolicy())) })
	}
}

// TestCheckModelDriverPolicy: engine_binary is refused at plan under the
// llm plugin's default policy, naming the attribute, and accepted where the
// provider's driver_policy says the clients allow task binaries.
func TestCheckModelDriverPolicy(t *testing.T) {
	s := modelSpec{Name: "m", Datacenters: []string{"*"}, Engine: "sim", Model: "m",
		Role: modelRoleBoth, Count: 1, CPU: 100, MemoryMB: 64, EngineBinary: "/opt/oasis-sim"}

	ps := checkModel(s, config.DefaultPolicy())
	must.Len(t, 1, ps)
	must.Eq(t, "engine_binary", ps[0].Path.String())
	must.StrContains(t, ps[0].Msg, `"/opt/oasis-sim"`)
	must.StrContains(t, ps[0].Msg, "allow_task_binary = true")

	must.SliceEmpty(t, checkModel(s, config.Policy{AllowTaskBinary: true, DefaultUser: config.DefaultUser}))
	// Before the provider is configured (tofu validate) the policy is not known: nothing is refused for it.
	must.SliceEmpty(t, checkModel(s, policyOf(nil)))
	must.Eq(t, config.DefaultPolicy(), policyOf(&Clients{DriverPolicy: config.DefaultPolicy()}))
}

// planTiers is a tier source over fixed declarations, standing in for the
// Nomad variables the provider reads at plan time.
type planTiers map[string]map[string]string

func (p planTiers) Tier(_ context.Context, name string) (*config.Tier, error) {
	items, ok := p[name]
	if !ok {
		return nil, &config.FieldError{Field: "kv_offload_tier", Msg: "tier " + name + ": " + config.ErrTierNotDeclared.Error()}
	}
	return config.ParseTier(name, items)
}

// TestCheckModelTier: kv_offload_tier is read at plan time and refused on the
// attribute at fault; without clients (ValidateConfig) it is left unchecked.
func TestCheckModelTier(t *testing.T) {
	src := planTiers{
		"node-kv": {"kind": "kvcached", "address": "127.0.0.1:6380", "auth": "none"},
		"nfs":     {"kind": "shared-fs", "path": "/mnt/kv"},
		"l3":      {"kind": "hicache-storage", "backend": "file"},
	}
	base := func() modelSpec {
		return modelSpec{Name: "m", Datacenters: []string{"*"}, Engine: "vllm", Model: "org/m",
			Role: modelRoleBoth, Count: 1, CPU: 500, MemoryMB: 1024, GPUs: ptr(1), KVOffloadTier: "node-kv"}
	}
	cases := []struct {
		name     string
		edit     func(*modelSpec)
		attr     string // "" = no problem
		contains string
	}{
		{"kvcached tier", func(*modelSpec) {}, "", ""},
		{"disaggregated vllm with a tier", func(s *modelSpec) { s.Role = modelRoleDisaggregated }, "", ""},
		{"not declared", func(s *modelSpec) { s.KVOffloadTier = "other" }, "kv_offload_tier", "tier is not declared"},
		{"kind the engine cannot use", func(s *modelSpec) { s.KVOffloadTier = "l3" }, "kv_offload_tier", `renders kv_offload = "hicache"`},
		{"shared-fs on vllm without size", func(s *modelSpec) { s.KVOffloadTier = "nfs" }, "kv_offload_tier", "item size_gb: kind shared-fs with engine vllm needs"},
		{"beside kv_offload", func(s *modelSpec) { s.KVOffload = "lmcache"; s.KVOffloadSizeGB = 4 }, "kv_offload", "set beside kv_offload_tier"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := base()
			tc.edit(&s)
			ps := checkModelTiers(context.Background(), s, config.DefaultPolicy(), src)
			if tc.attr == "" {
				must.SliceEmpty(t, ps)
				return
			}
			var found bool
			for _, p := range ps {
				found = found || (p.Path.String() == tc.attr && strings.Contains(p.Msg, tc.contains))
			}
			must.True(t, found, must.Sprintf("no problem on %s containing %q in %v", tc.attr, tc.contains, ps))
		})
	}
	s := base()
	s.KVOffloadTier = "other"
	must.SliceEmpty(t, checkModel(s, config.DefaultPolicy()), must.Sprint("without clients the tier is not read"))
	job := renderModelJob(base())
	task := job.TaskGroups[0].Tasks[0]
	must.EqOp(t, "node-kv", task.Config["kv_offload_tier"].(string))
	must.True(t, task.Identity != nil && task.Identity.File, must.Sprint("the task exposes its identity to the driver"))
}
