package provider

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

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

// TestRenderDrainBounds: every group gets the recipes' shutdown_delay and
// its task their kill_timeout, so a rolling update or node drain of a
// provider-rendered model drains its requests as the recipe's does.
func TestRenderDrainBounds(t *testing.T) {
	tp4 := renderCases["vllm-agg-native-offload"]
	tp4.TensorParallelSize = 4
	cases := []struct {
		name   string
		spec   modelSpec
		recipe string
		want   map[string][2]string // group → shutdown_delay, kill_timeout
	}{
		{"sim", renderCases["sim-agg"], "recipes/tiny/sim/agg", map[string][2]string{"engine": {"2s", "30s"}}},
		{"vllm", renderCases["vllm-agg-native-offload"], "recipes/llama3-8b/vllm/agg", map[string][2]string{"engine": {"5s", "120s"}}},
		{"vllm tp4", tp4, "recipes/llama3-70b/vllm/agg-tp4", map[string][2]string{"engine": {"5s", "180s"}}},
		{"vllm disagg", renderCases["vllm-disagg"], "recipes/llama3-8b/vllm/disagg-nixl",
			map[string][2]string{"prefill": {"5s", "60s"}, "decode": {"5s", "120s"}}},
		{"llama.cpp", renderCases["llama-cpp-cpu"], "recipes/llama3-8b/llama-cpp/cpu", map[string][2]string{"engine": {"5s", "120s"}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			recipe, err := os.ReadFile(filepath.Join("..", "..", tc.recipe, "job.nomad.hcl"))
			must.NoError(t, err)
			job := renderModelJob(tc.spec)
			must.Len(t, len(tc.want), job.TaskGroups)
			for _, g := range job.TaskGroups {
				want, ok := tc.want[*g.Name]
				must.True(t, ok, must.Sprint("group ", *g.Name))
				must.NotNil(t, g.ShutdownDelay)
				must.EqOp(t, want[0], secs(*g.ShutdownDelay))
				must.EqOp(t, want[1], secs(*g.Tasks[0].KillTimeout))
				// The recipe sets the same values.
				must.StrContains(t, string(recipe), `shutdown_delay = "`+want[0]+`"`)
				must.StrContains(t, string(recipe), `kill_timeout = "`+want[1]+`"`)
			}
		})
	}
}

// secs writes d as the recipes do: "120s".
func secs(d time.Duration) string { return strconv.Itoa(int(d.Seconds())) + "s" }
