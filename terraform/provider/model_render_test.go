package provider

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// renderCases are the configurations pinned by golden files.
var renderCases = map[string]modelSpec{
	"sim-agg": {
		Name: "tiny-sim", Region: "global", Datacenters: []string{"*"}, Engine: "sim", Model: "tiny-sim",
		Role: modelRoleBoth, Count: 2, ExtraArgs: []string{"--speed", "0"}, EngineBinary: "/opt/oasis/oasis-sim",
		CPU: 200, MemoryMB: 128,
	},
	"vllm-agg-native-offload": {
		Name: "llama3-8b", Region: "east", Namespace: "ml", Datacenters: []string{"dc1", "dc2"}, NodePool: "gpu",
		Engine: "vllm", Model: "meta-llama/Llama-3.1-8B-Instruct", Role: modelRoleBoth, Count: 3,
		KVOffload: "native", KVOffloadSizeGB: 64, TensorParallelSize: 2, MaxModelLen: 8192,
		GPUMemoryUtilization: 0.9, CPU: 4000, MemoryMB: 16384,
	},
	"vllm-disagg": {
		Name: "llama3-8b", Datacenters: []string{"*"}, Engine: "vllm", Model: "meta-llama/Llama-3.1-8B-Instruct",
		Role: modelRoleDisaggregated, PrefillCount: 1, DecodeCount: 2, MaxModelLen: 8192,
		GPUMemoryUtilization: 0.9, CPU: 4000, MemoryMB: 16384,
	},
	"sglang-disagg": {
		Name: "llama3-8b", Datacenters: []string{"*"}, Engine: "sglang", Model: "meta-llama/Llama-3.1-8B-Instruct",
		Role: modelRoleDisaggregated, PrefillCount: 1, DecodeCount: 1, GPUMemoryUtilization: 0.85,
		BlockSize: 32, CPU: 4000, MemoryMB: 16384,
	},
	"llama-cpp-cpu": {
		Name: "llama3-8b-q4", Datacenters: []string{"*"}, Engine: "llama_cpp", Model: "/models/llama3-8b.Q4_K_M.gguf",
		Role: modelRoleBoth, Count: 1, MaxModelLen: 4096, CPU: 8000, MemoryMB: 8192, GPUs: ptr(0),
	},
}

func TestRenderModelJobGolden(t *testing.T) {
	for name, s := range renderCases {
		t.Run(name, func(t *testing.T) {
			job := renderModelJob(s)
			got, err := json.MarshalIndent(job, "", "  ")
			must.NoError(t, err)
			got = append(got, '\n')
			golden := filepath.Join("testdata", "models", name+".json")
			if *update {
				must.NoError(t, os.WriteFile(golden, got, 0o644))
			}
			want, err := os.ReadFile(golden)
			must.NoError(t, err, must.Sprint("run go test -run TestRenderModelJobGolden -update"))
			must.EqOp(t, string(want), string(got))
			// Every pinned configuration passes the llm driver's checks, but for
			// engine_binary: plan checks against the driver's default policy,
			// which refuses a task's own binary (TestCheckModel).
			s.EngineBinary = ""
			must.SliceEmpty(t, checkModel(s, config.DefaultPolicy()))
		})
	}
}

func TestRenderModelJobPure(t *testing.T) {
	s := renderCases["vllm-disagg"]
	a, err := json.Marshal(renderModelJob(s))
	must.NoError(t, err)
	b, err := json.Marshal(renderModelJob(s))
	must.NoError(t, err)
	must.EqOp(t, string(a), string(b))
}

func TestSpecHashIgnoresCountsAndPlacement(t *testing.T) {
	s := renderCases["sim-agg"]
	h1, err := specHash(renderModelJob(s))
	must.NoError(t, err)
	s.Count, s.Region, s.Namespace = 7, "west", "other"
	h2, err := specHash(renderModelJob(s))
	must.NoError(t, err)
	must.EqOp(t, h1, h2)
	s.ExtraArgs = []string{"--speed", "1"}
	h3, err := specHash(renderModelJob(s))
	must.NoError(t, err)
	must.NotEqOp(t, h1, h3)
}
