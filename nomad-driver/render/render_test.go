package render

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/oasis-llm/oasis/nomad-driver/config"
	"github.com/shoenig/test/must"
)

var update = flag.Bool("update", false, "rewrite golden files under testdata/")

var testPorts = map[string]Port{
	"http":      {HostIP: "10.0.0.5", Value: 20001},
	"kv":        {HostIP: "10.0.0.5", Value: 20002},
	"nixl":      {HostIP: "10.0.0.5", Value: 20003},
	"bootstrap": {HostIP: "10.0.0.5", Value: 20004},
	"replay":    {HostIP: "10.0.0.5", Value: 20005},
}

// bridgePorts is a bridge-mode allocation: host ports on the node's address
// mapped to fixed ports inside the namespace; "replay" has no "to" (-1), so
// it keeps its host number inside.
var bridgePorts = map[string]Port{
	"http":   {HostIP: "10.0.0.5", Value: 20001, To: 8000},
	"kv":     {HostIP: "10.0.0.5", Value: 20002, To: 5557},
	"replay": {HostIP: "10.0.0.5", Value: 20005, To: -1},
}

const (
	testLocalDir   = "/alloc/task/local"
	testSecretsDir = "/alloc/task/secrets"
)

// baseConfig is a config that is complete for the combination, so that a
// golden error shows only what the combination itself is refused for.
func baseConfig(engine, offload, role string) config.TaskConfig {
	c := config.TaskConfig{Engine: engine, Model: "meta-llama/Llama-3.1-8B-Instruct", Port: "http",
		KVOffload: offload, Role: role}
	switch engine {
	case config.EngineLlamaCpp:
		c.Model = "/models/llama-3.1-8b-instruct-q4_k_m.gguf"
		c.ServedModelName = "llama-3.1-8b"
	case config.EngineOpenAICompat:
		c.Port = ""
		c.Endpoint = "https://api.example.com/v1"
	}
	if config.SupportsKVEvents(engine) {
		c.KVEventsPort = "kv"
	}
	if (engine == config.EngineVLLM || engine == config.EngineSim) && role != config.RoleBoth {
		c.NIXLSideChannelPort = "nixl"
	}
	if engine == config.EngineSGLang && role == config.RolePrefill {
		c.BootstrapPort = "bootstrap"
	}
	switch offload {
	case config.OffloadNative, config.OffloadLMCache, config.OffloadKVBM, config.OffloadKVCached, config.OffloadHiCache, config.OffloadFlexKV:
		c.KVOffloadSizeGB = 8
	}
	return c
}

// testTier parses a declaration that must be valid.
func testTier(name string, items map[string]string) *config.Tier {
	t, err := config.ParseTier(name, items)
	if err != nil {
		panic(err)
	}
	return t
}

func testInput(c config.TaskConfig) Input {
	return Input{Config: c, Binary: "/opt/engines/" + DefaultBinary(c.Engine), Ports: testPorts,
		GPUs: []string{"GPU-5e0d6d1c-0000-0000-0000-000000000001"}, LocalDir: testLocalDir, SecretsDir: testSecretsDir}
}

// format renders a plan (or its error) as the golden text.
func format(p *Plan, err error) string {
	if err != nil {
		return "error:\n" + indent(strings.ReplaceAll(err.Error(), "\n", "\n")) + "\n"
	}
	var b strings.Builder
	if p.NoProcess {
		b.WriteString("no process\n")
	}
	b.WriteString("argv:\n")
	for _, a := range p.Argv {
		fmt.Fprintf(&b, "  %s\n", a)
	}
	b.WriteString("env:\n")
	var keys []string
	for k := range p.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "  %s=%s\n", k, p.Env[k])
	}
	b.WriteString("files:\n")
	for _, f := range p.Files {
		secret := ""
		if f.Secret {
			secret = " (secret: 0600, the engine's account)"
		}
		fmt.Fprintf(&b, "  --- %s%s\n%s", f.Path, secret, indent(string(f.Content)))
	}
	fmt.Fprintf(&b, "health: %s\nmetrics: %s\nkv_events: %s\n", p.HealthURL, p.MetricsPath, p.KVEventsEndpoint)
	if p.KVEventsReplayEndpoint != "" {
		fmt.Fprintf(&b, "kv_events_replay: %s\n", p.KVEventsReplayEndpoint)
	}
	return b.String()
}

func indent(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	for i, l := range lines {
		lines[i] = "    " + l
	}
	return strings.Join(lines, "\n") + "\n"
}

func checkGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		must.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		must.NoError(t, os.WriteFile(path, []byte(got), 0o644))
		return
	}
	want, err := os.ReadFile(path)
	must.NoError(t, err, must.Sprint("missing golden file; run go test ./nomad-driver/render -update"))
	must.EqOp(t, string(want), got)
}

// TestRenderMatrix pins every engine × kv_offload × role combination:
// valid ones to their exact argv, env and files, invalid ones to their error.
func TestRenderMatrix(t *testing.T) {
	for _, e := range config.Engines {
		for _, o := range config.Offloads {
			for _, r := range config.Roles {
				name := e + "-" + o + "-" + r
				t.Run(name, func(t *testing.T) {
					p, err := Render(testInput(baseConfig(e, o, r)))
					if config.Supported(e, o, r) {
						must.NoError(t, err)
					} else {
						must.Error(t, err)
						must.StrContains(t, err.Error(), "allowed")
					}
					checkGolden(t, filepath.Join("matrix", name), format(p, err))
				})
			}
		}
	}
}

// TestRenderCases pins renderings of the optional fields.
func TestRenderCases(t *testing.T) {
	twoGPUs := []string{"GPU-a", "GPU-b"}
	cases := []struct {
		name string
		in   func() Input
	}{
		{"vllm-tp2-limits", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.TensorParallelSize, c.MaxModelLen, c.GPUMemoryUtilization, c.BlockSize = 2, 32768, 0.85, 32
			in := testInput(c)
			in.GPUs = twoGPUs
			return in
		}},
		{"vllm-events-off-extra", func() Input {
			c := baseConfig("vllm", "none", "both")
			off := false
			c.KVEvents, c.KVEventsPort = &off, ""
			c.ServedModelName = "llama"
			c.ExtraArgs = []string{"--enable-prefix-caching", "--max-num-seqs=128"}
			c.ExtraEnv = map[string]string{"HF_HOME": "/data/hf"}
			return testInput(c)
		}},
		{"vllm-served-names-lora", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.ServedModelName = "m3"
			c.ServedModelNames = []string{"m3-alias"}
			c.LoRAModules = []string{"sql-lora=/models/adapters/sql", "chat-lora=org/chat-lora"}
			return testInput(c)
		}},
		{"sim-lora", func() Input {
			c := baseConfig("sim", "none", "both")
			c.LoRAModules = []string{"sql-lora=/models/adapters/sql"}
			return testInput(c)
		}},
		{"vllm-lora-loadable", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.LoRALoadable = []string{"sql-lora=/models/adapters/sql"}
			return testInput(c)
		}},
		{"llama_cpp-lora-loadable", func() Input {
			c := baseConfig("llama_cpp", "none", "both")
			c.LoRALoadable = []string{"sql-lora=/models/adapters/sql.gguf", "chat-lora=local/chat.gguf"}
			return testInput(c)
		}},
		{"vllm-kvcached-remote-only", func() Input {
			c := baseConfig("vllm", "kvcached", "both")
			c.KVOffloadSizeGB, c.KVCachedAddress = 0, "10.0.0.5:16380"
			return testInput(c)
		}},
		{"sim-no-gpus", func() Input {
			in := testInput(baseConfig("sim", "none", "both"))
			in.GPUs = nil
			in.Binary = ""
			return in
		}},
		{"sglang-launcher-tp2-hicache-ratio", func() Input {
			c := baseConfig("sglang", "hicache", "both")
			c.KVOffloadSizeGB, c.TensorParallelSize, c.MaxModelLen, c.GPUMemoryUtilization = 0, 2, 8192, 0.8
			in := testInput(c)
			in.Binary, in.GPUs = "/usr/local/bin/sglang-launch", twoGPUs
			return in
		}},
		{"llama_cpp-cpu", func() Input {
			c := baseConfig("llama_cpp", "none", "both")
			c.MaxModelLen = 4096
			in := testInput(c)
			in.GPUs = nil
			return in
		}},
		{"trtllm-limits", func() Input {
			c := baseConfig("trtllm", "none", "both")
			c.MaxModelLen, c.GPUMemoryUtilization = 16384, 0.9
			return testInput(c)
		}},
		{"vllm-events-replay", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.KVEventsReplayPort = "replay"
			return testInput(c)
		}},
		{"sglang-events-replay", func() Input {
			c := baseConfig("sglang", "none", "both")
			c.KVEventsReplayPort = "replay"
			return testInput(c)
		}},
		{"sim-sglang-prefill", func() Input {
			c := baseConfig("sim", "none", "prefill")
			c.NIXLSideChannelPort, c.BootstrapPort = "", "bootstrap"
			return testInput(c)
		}},
		{"sim-sglang-decode", func() Input {
			c := baseConfig("sim", "nixl", "decode")
			c.NIXLSideChannelPort, c.BootstrapPort = "", "bootstrap"
			return testInput(c)
		}},
		{"sim-events-replay-any", func() Input {
			c := baseConfig("sim", "none", "both")
			c.KVEventsReplayPort = "replay"
			in := testInput(c)
			in.Ports = map[string]Port{"http": {Value: 8000}, "kv": {Value: 5557}, "replay": {Value: 5558}}
			return in
		}},
		{"vllm-lmcache-replay", func() Input {
			c := baseConfig("vllm", "lmcache", "both")
			c.KVEventsReplayPort = "replay"
			c.ExtraEnv = map[string]string{"PYTHONHASHSEED": "42"}
			return testInput(c)
		}},
		{"sim-bridge-events", func() Input {
			c := baseConfig("sim", "none", "both")
			c.KVEventsReplayPort = "replay"
			in := testInput(c)
			in.Namespaced = true
			in.Ports = bridgePorts
			return in
		}},
		{"sim-bridge-loopback-events", func() Input {
			c := baseConfig("sim", "none", "both")
			c.BindAddress = "127.0.0.1" // the API for the sidecar only; events stay on the mapped ports
			c.KVEventsReplayPort = "replay"
			in := testInput(c)
			in.Namespaced, in.Ports = true, bridgePorts
			return in
		}},
		{"llama_cpp-bridge-loopback", func() Input {
			c := baseConfig("llama_cpp", "none", "both")
			c.BindAddress = "127.0.0.1"
			in := testInput(c)
			in.Namespaced, in.Ports, in.GPUs = true, bridgePorts, nil
			return in
		}},
		{"vllm-host-bind-address", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.BindAddress = "0.0.0.0"
			return testInput(c)
		}},
		{"vllm-otlp-http", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.OTLPTracesEndpoint = "http://10.0.0.9:4318"
			return testInput(c)
		}},
		{"vllm-otlp-grpc", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.OTLPTracesEndpoint = "grpc://10.0.0.9:4317"
			return testInput(c)
		}},
		{"trtllm-llm-api-options", func() Input {
			c := baseConfig("trtllm", "none", "both")
			c.LLMAPIOptions = map[string]string{"enable_iter_perf_stats": "false", "print_iter_log": "true",
				"kv_cache_config.dtype": "fp8", "kv_cache_config.event_buffer_max_size": "1024",
				"cuda_graph_config.enable_padding": "true", "cuda_graph_config.max_batch_size": "256",
				"guided_decoding_backend": "xgrammar: {a: 1}"}
			return testInput(c)
		}},
		{"trtllm-native-llm-api-options", func() Input {
			c := baseConfig("trtllm", "native", "both")
			c.LLMAPIOptions = map[string]string{"kv_cache_config.enable_block_reuse": "false", "kv_cache_config.dtype": "fp8"}
			return testInput(c)
		}},
		{"sglang-prefill-mooncake", func() Input {
			c := baseConfig("sglang", "none", "prefill")
			c.DisaggTransferBackend = "mooncake"
			return testInput(c)
		}},
		{"sglang-decode-mooncake", func() Input {
			c := baseConfig("sglang", "none", "decode")
			c.DisaggTransferBackend = "mooncake"
			return testInput(c)
		}},
		{"sim-sglang-prefill-mooncake", func() Input {
			c := baseConfig("sim", "none", "prefill")
			c.NIXLSideChannelPort, c.BootstrapPort, c.DisaggTransferBackend = "", "bootstrap", "mooncake"
			return testInput(c)
		}},
		{"sglang-hicache-storage-file", func() Input {
			c := baseConfig("sglang", "hicache", "both")
			c.HiCacheStorageBackend = "file"
			return testInput(c)
		}},
		{"sglang-prefill-hicache-storage-mooncake", func() Input {
			c := baseConfig("sglang", "hicache", "prefill")
			c.HiCacheStorageBackend, c.DisaggTransferBackend = "mooncake", "mooncake"
			return testInput(c)
		}},
		{"vllm-tier-kvcached", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.KVOffloadTier = "node-kv"
			in := testInput(c)
			in.Tier = testTier("node-kv", map[string]string{"kind": "kvcached", "address": "${node.ip}:6380", "size_gb": "4",
				"secret_path": "oasis/secrets/kvcached"})
			in.Tier.Secret = "p@ss:w/rd %"
			return in
		}},
		{"sim-tier-kvcached-no-auth", func() Input {
			c := baseConfig("sim", "none", "both")
			c.KVOffloadTier = "open-kv"
			in := testInput(c)
			in.Tier = testTier("open-kv", map[string]string{"kind": "kvcached", "address": "127.0.0.1:6380", "auth": "none"})
			return in
		}},
		{"sglang-tier-kvcached", func() Input {
			c := baseConfig("sglang", "none", "both")
			c.KVOffloadTier = "node-kv"
			in := testInput(c)
			in.Tier = testTier("node-kv", map[string]string{"kind": "kvcached", "address": "${node.ip}:6380",
				"secret_path": "nomad/jobs/oasis-kvcached/kvcached", "secret_item": "redis_password"})
			in.Tier.Secret = "s3cret"
			return in
		}},
		{"vllm-tier-lmcache-server", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.KVOffloadTier = "lmcache"
			in := testInput(c)
			in.Tier = testTier("lmcache", map[string]string{"kind": "lmcache-server", "address": "lmcache.service.consul:65432", "size_gb": "8"})
			return in
		}},
		{"sglang-tier-shared-fs", func() Input {
			c := baseConfig("sglang", "none", "both")
			c.KVOffloadTier = "nfs"
			in := testInput(c)
			in.Tier = testTier("nfs", map[string]string{"kind": "shared-fs", "path": "/mnt/kv", "size_gb": "16"})
			return in
		}},
		{"sglang-tier-mooncake", func() Input {
			c := baseConfig("sglang", "none", "both")
			c.KVOffloadTier = "mc"
			in := testInput(c)
			in.Tier = testTier("mc", map[string]string{"kind": "mooncake", "address": "${node.ip}:50051", "protocol": "rdma",
				"metadata_server": "P2PHANDSHAKE", "size_gb": "32"})
			return in
		}},
		{"sglang-bridge-tier-lmcache-server", func() Input {
			c := baseConfig("sglang", "none", "both")
			c.KVOffloadTier = "lm"
			in := testInput(c)
			in.Namespaced, in.Ports = true, bridgePorts
			in.Tier = testTier("lm", map[string]string{"kind": "lmcache-server", "address": "${node.ip}:65432", "size_gb": "4"})
			return in
		}},
		{"sglang-prefill-tier-hicache-mooncake", func() Input {
			c := baseConfig("sglang", "none", "prefill")
			c.KVOffloadTier = "mooncake-l3"
			in := testInput(c)
			in.Tier = testTier("mooncake-l3", map[string]string{"kind": "hicache-storage", "backend": "mooncake"})
			return in
		}},
		{"vllm-tier-shared-fs", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.KVOffloadTier = "nfs"
			in := testInput(c)
			in.Tier = testTier("nfs", map[string]string{"kind": "shared-fs", "path": "/mnt/kv", "size_gb": "7.5"})
			return in
		}},
		{"sim-prefill-tier-shared-fs", func() Input {
			c := baseConfig("sim", "none", "prefill")
			c.KVOffloadTier, c.BlockSize = "nfs", 512
			in := testInput(c)
			in.Tier = testTier("nfs", map[string]string{"kind": "shared-fs", "path": "/mnt/kv", "size_gb": "8"})
			return in
		}},
		{"vllm-tier-mooncake", func() Input {
			c := baseConfig("vllm", "none", "both")
			c.KVOffloadTier = "mc"
			in := testInput(c)
			in.Tier = testTier("mc", map[string]string{"kind": "mooncake", "address": "${node.ip}:50051", "size_gb": "4"})
			return in
		}},
		{"vllm-decode-tier-mooncake-rdma", func() Input {
			c := baseConfig("vllm", "none", "decode")
			c.KVOffloadTier = "mc"
			in := testInput(c)
			in.Tier = testTier("mc", map[string]string{"kind": "mooncake", "address": "mooncake.service.consul:50051", "size_gb": "16",
				"protocol": "rdma", "metadata_server": "http://10.0.0.5:8080/metadata"})
			return in
		}},
		{"vllm-flexkv-ssd", func() Input {
			c := baseConfig("vllm", "flexkv", "both")
			c.KVOffloadSizeGB = 12.5
			c.ExtraEnv = map[string]string{"FLEXKV_SSD_CACHE_GB": "512", "FLEXKV_SSD_CACHE_DIR": "/data/flexkv"}
			return testInput(c)
		}},
		{"vllm-ipv6-any", func() Input {
			in := testInput(baseConfig("vllm", "none", "both"))
			in.Ports = map[string]Port{"http": {Value: 8000}, "kv": {Value: 5557}}
			return in
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := Render(tc.in())
			must.NoError(t, err)
			checkGolden(t, filepath.Join("cases", tc.name), format(p, err))
		})
	}
}

// TestRenderBadInput: each mistake is an error naming its field and what is allowed.
func TestRenderBadInput(t *testing.T) {
	cases := []struct {
		name   string
		mutate func(*Input)
		field  string
		want   string
	}{
		{"unknown engine", func(in *Input) { in.Config.Engine = "tgi" }, "engine", "allowed: vllm, sglang, llama_cpp, trtllm, openai_compat, sim"},
		{"unknown offload", func(in *Input) { in.Config.KVOffload = "disk" }, "kv_offload", "allowed: none, native, lmcache, kvcached, nixl, hicache, kvbm"},
		{"unknown role", func(in *Input) { in.Config.Role = "both-ways" }, "role", "allowed: both, prefill, decode"},
		{"incompatible offload", func(in *Input) { in.Config.KVOffload = "hicache"; in.Config.KVOffloadSizeGB = 4 }, "kv_offload", "allowed for vllm with role both: none, native, lmcache, kvcached, kvbm"},
		{"incompatible role", func(in *Input) { in.Config.KVOffload = "nixl" }, "role", "allowed roles: prefill, decode"},
		{"missing model", func(in *Input) { in.Config.Model = " " }, "model", "is required"},
		{"missing port", func(in *Input) { in.Config.Port = "" }, "port", "is required"},
		{"tp larger than gpus", func(in *Input) { in.Config.TensorParallelSize = 4 }, "tensor_parallel_size", "larger than the 1 GPU(s) reserved"},
		{"no gpus", func(in *Input) { in.GPUs = nil }, "tensor_parallel_size", "reserve them with a device"},
		{"port label missing", func(in *Input) { in.Config.Port = "api" }, "port", `"api" is not in the group's network block; labels: bootstrap, http, kv, nixl, replay`},
		{"events label missing", func(in *Input) { in.Config.KVEventsPort = "zmq" }, "kv_events_port", `"zmq" is not in the group's network block`},
		{"events without port", func(in *Input) { in.Config.KVEventsPort = "" }, "kv_events_port", "set kv_events_port"},
		{"traces on unsupported engine", func(in *Input) {
			in.Config.Engine, in.Config.OTLPTracesEndpoint = "sglang", "http://10.0.0.9:4318"
		}, "otlp_traces_endpoint", "allowed for: vllm"},
		{"traces endpoint without port", func(in *Input) { in.Config.OTLPTracesEndpoint = "http://collector" }, "otlp_traces_endpoint", "with host and port"},
		{"traces endpoint without scheme", func(in *Input) { in.Config.OTLPTracesEndpoint = "collector:4317" }, "otlp_traces_endpoint", "grpc://host:4317"},
		{"traces gRPC endpoint with path", func(in *Input) { in.Config.OTLPTracesEndpoint = "grpc://collector:4317/v1/traces" }, "otlp_traces_endpoint", "has no path"},
		{"events on unsupported engine", func(in *Input) {
			on := true
			in.Config.Engine, in.Config.KVEvents, in.Config.KVEventsPort = "llama_cpp", &on, ""
		}, "kv_events", "allowed for: vllm, sglang, sim"},
		{"replay label missing", func(in *Input) { in.Config.KVEventsReplayPort = "zmq-replay" }, "kv_events_replay_port", `"zmq-replay" is not in the group's network block`},
		{"replay with events off", func(in *Input) {
			off := false
			in.Config.KVEvents, in.Config.KVEventsPort, in.Config.KVEventsReplayPort = &off, "", "replay"
		}, "kv_events_replay_port", "set while kv_events = false"},
		{"replay on the events port", func(in *Input) { in.Config.KVEventsReplayPort = "kv" }, "kv_events_replay_port", "needs its own port label"},
		{"replay on unsupported engine", func(in *Input) {
			in.Config = baseConfig("llama_cpp", "none", "both")
			in.Config.KVEventsReplayPort = "replay"
		}, "kv_events_replay_port", "allowed for: vllm, sglang, sim"},
		{"replay on openai_compat", func(in *Input) {
			in.Config = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o", Endpoint: "http://h:1/v1", KVEventsReplayPort: "replay"}
		}, "kv_events_replay_port", "runs no process"},
		{"hash algo owned", func(in *Input) { in.Config.ExtraArgs = []string{"--prefix-caching-hash-algo=sha256"} }, "extra_args", `"--prefix-caching-hash-algo" is rendered by the driver`},
		{"offload without size", func(in *Input) { in.Config.KVOffload = "lmcache" }, "kv_offload_size_gb", "needs the CPU cache size"},
		{"size without offload", func(in *Input) { in.Config.KVOffloadSizeGB = 3 }, "kv_offload_size_gb", "allowed with: native, lmcache, kvcached, hicache, kvbm"},
		{"gpu util out of range", func(in *Input) { in.Config.GPUMemoryUtilization = 1.5 }, "gpu_memory_utilization", "must be in (0, 1]"},
		{"block size not power of two", func(in *Input) { in.Config.BlockSize = 24 }, "block_size", "powers of two"},
		{"extra arg owned", func(in *Input) { in.Config.ExtraArgs = []string{"--port=9000"} }, "extra_args", `"--port" is rendered by the driver from the task config; set port instead`},
		{"trtllm options flag points to llm_api_options", func(in *Input) {
			in.Config = baseConfig("trtllm", "none", "both")
			in.Config.ExtraArgs = []string{"--extra_llm_api_options", "/tmp/x.yaml"}
		}, "extra_args", `"--extra_llm_api_options" is rendered by the driver from the task config; set llm_api_options (and kv_offload = "native") instead`},
		{"trtllm tp alias owned", func(in *Input) {
			in.Config = baseConfig("trtllm", "none", "both")
			in.Config.ExtraArgs = []string{"--tp", "2"}
		}, "extra_args", `set tensor_parallel_size instead`},
		{"llm_api_options on vllm", func(in *Input) { in.Config.LLMAPIOptions = map[string]string{"print_iter_log": "true"} }, "llm_api_options", "allowed for: trtllm"},
		{"llm_api_options unknown", func(in *Input) {
			in.Config = baseConfig("trtllm", "none", "both")
			in.Config.LLMAPIOptions = map[string]string{"tensor_parallel_size": "2"}
		}, "llm_api_options", `unknown option "tensor_parallel_size"; allowed: attn_backend`},
		{"llm_api_options owned", func(in *Input) {
			in.Config = baseConfig("trtllm", "native", "both")
			in.Config.LLMAPIOptions = map[string]string{"kv_cache_config.host_cache_size": "1"}
		}, "llm_api_options", `"kv_cache_config.host_cache_size" is rendered by the driver from kv_offload_size_gb`},
		{"llm_api_options bad key", func(in *Input) {
			in.Config = baseConfig("trtllm", "none", "both")
			in.Config.LLMAPIOptions = map[string]string{"kv_cache_config..dtype": "fp8"}
		}, "llm_api_options", "is not an option path"},
		{"llm_api_options multi-line value", func(in *Input) {
			in.Config = baseConfig("trtllm", "none", "both")
			in.Config.LLMAPIOptions = map[string]string{"sampler_type": "auto\nbackend: tensorrt"}
		}, "llm_api_options", "must be one line"},
		{"llm_api_options value and parent", func(in *Input) {
			in.Config = baseConfig("trtllm", "none", "both")
			in.Config.LLMAPIOptions = map[string]string{"kv_cache_config": "x", "kv_cache_config.dtype": "fp8"}
		}, "llm_api_options", `"kv_cache_config" is a value and "kv_cache_config.dtype" one of its settings`},
		{"transfer backend unknown", func(in *Input) {
			in.Config = baseConfig("sglang", "none", "prefill")
			in.Config.DisaggTransferBackend = "ascend"
		}, "disaggregation_transfer_backend", "allowed: nixl, mooncake"},
		{"transfer backend on aggregated sglang", func(in *Input) {
			in.Config = baseConfig("sglang", "none", "both")
			in.Config.DisaggTransferBackend = "mooncake"
		}, "disaggregation_transfer_backend", "with role prefill or decode"},
		{"transfer backend on vllm", func(in *Input) {
			in.Config.Role, in.Config.NIXLSideChannelPort, in.Config.DisaggTransferBackend = "prefill", "nixl", "mooncake"
		}, "disaggregation_transfer_backend", "only used by sglang"},
		{"hicache storage without hicache", func(in *Input) {
			in.Config = baseConfig("sglang", "none", "both")
			in.Config.HiCacheStorageBackend = "file"
		}, "hicache_storage_backend", `set kv_offload = "hicache"`},
		{"hicache storage dynamic", func(in *Input) {
			in.Config = baseConfig("sglang", "hicache", "both")
			in.Config.HiCacheStorageBackend = "dynamic"
		}, "hicache_storage_backend", "allowed: file, mooncake, nixl, hf3fs, aibrix, eic"},
		{"hicache storage flag owned", func(in *Input) {
			in.Config = baseConfig("sglang", "hicache", "both")
			in.Config.ExtraArgs = []string{"--hicache_storage_backend=file"}
		}, "extra_args", "set hicache_storage_backend instead"},
		{"disagg without nixl port", func(in *Input) { in.Config.Role = "prefill" }, "nixl_side_channel_port", "needs a port label"},
		{"openai_compat without endpoint", func(in *Input) {
			in.Config = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o"}
		}, "endpoint", "is required for engine openai_compat"},
		{"openai_compat bad endpoint", func(in *Input) {
			in.Config = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o", Endpoint: "ftp://x"}
		}, "endpoint", "not an http(s) URL"},
		{"openai_compat with process fields", func(in *Input) {
			in.Config = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o", Endpoint: "http://h:1/v1", Port: "http"}
		}, "port", "runs no process"},
		{"endpoint on process engine", func(in *Input) { in.Config.Endpoint = "http://h:1" }, "endpoint", "only used by engine openai_compat"},
		{"kvcached address bad", func(in *Input) {
			in.Config.KVOffload, in.Config.KVCachedAddress = "kvcached", "localhost"
		}, "kvcached_address", "not host:port"},
		{"llama tp", func(in *Input) {
			in.Config = baseConfig("llama_cpp", "none", "both")
			in.Config.TensorParallelSize = 2
		}, "tensor_parallel_size", "allowed: 1"},
		{"bad health timeout", func(in *Input) { in.Config.HealthTimeout = "soon" }, "health_timeout", "not a positive duration"},
		{"bind address not an IP", func(in *Input) { in.Config.BindAddress = "localhost" }, "bind_address", "not an IP address"},
		{"bind address on openai_compat", func(in *Input) {
			in.Config = config.TaskConfig{Engine: "openai_compat", Model: "gpt-4o", Endpoint: "http://h:1/v1", BindAddress: "127.0.0.1"}
		}, "bind_address", "runs no process"},
		{"tier beside kv_offload", func(in *Input) {
			in.Config.KVOffloadTier, in.Config.KVOffload, in.Config.KVOffloadSizeGB = "node-kv", "lmcache", 4
			in.Tier = testTier("node-kv", map[string]string{"kind": "kvcached", "address": "127.0.0.1:6380", "auth": "none"})
		}, "kv_offload", `set beside kv_offload_tier = "node-kv"`},
		{"tier not read", func(in *Input) { in.Config.KVOffloadTier = "node-kv" }, "kv_offload_tier", `the declaration of tier "node-kv" was not read`},
		{"tier name", func(in *Input) { in.Config.KVOffloadTier = "Node KV" }, "kv_offload_tier", "is not a tier name"},
		{"tier kind not rendered", func(in *Input) {
			in.Config.KVOffloadTier = "nx"
			in.Tier = testTier("nx", map[string]string{"kind": "nixl", "address": "10.0.0.9:5555"})
		}, "kv_offload_tier", `tier "nx" (Nomad variable oasis/tiers/nx) item kind: kind nixl is declared but not rendered by this driver (rendered: kvcached, lmcache-server, mooncake, hicache-storage, shared-fs): vLLM's NixlConnector`},
		{"mooncake tier on vllm without size", func(in *Input) {
			in.Config.KVOffloadTier = "mc"
			in.Tier = testTier("mc", map[string]string{"kind": "mooncake", "address": "10.0.0.9:50051"})
		}, "kv_offload_tier", `item size_gb: kind mooncake with engine vllm needs LMCache's CPU tier in front of the Mooncake store`},
		{"shared-fs tier on vllm without size", func(in *Input) {
			in.Config.KVOffloadTier = "nfs"
			in.Tier = testTier("nfs", map[string]string{"kind": "shared-fs", "path": "/mnt/kv"})
		}, "kv_offload_tier", `item size_gb: kind shared-fs with engine vllm needs the CPU staging buffer of llm-d's SharedStorageOffloadingSpec`},
		{"tier kind not for engine", func(in *Input) {
			in.Config = baseConfig("llama_cpp", "none", "both")
			in.Config.KVOffloadTier = "nfs"
			in.Tier = testTier("nfs", map[string]string{"kind": "shared-fs", "path": "/mnt/kv"})
		}, "kv_offload_tier", `tier "nfs" (kind shared-fs) renders kv_offload = "hicache": kv_offload: "hicache" is not supported by engine llama_cpp`},
		{"tier lmcache-server without size", func(in *Input) {
			in.Config.KVOffloadTier = "lm"
			in.Tier = testTier("lm", map[string]string{"kind": "lmcache-server", "address": "10.0.0.9:65432"})
		}, "kv_offload_tier", "item size_gb: kind lmcache-server needs the CPU tier"},
		{"tier loopback in bridge", func(in *Input) {
			in.Config.KVOffloadTier, in.Namespaced = "kv", true
			in.Tier = testTier("kv", map[string]string{"kind": "kvcached", "address": "127.0.0.1:6380", "auth": "none"})
		}, "kvcached_address", "not the node's kvcached"},
		{"disaggregated in bridge", func(in *Input) {
			in.Config.Role, in.Config.NIXLSideChannelPort, in.Namespaced = "prefill", "nixl", true
		}, "role", `run disaggregated engines with network mode "host"`},
		{"loopback kvcached in bridge", func(in *Input) {
			in.Config.KVOffload, in.Config.KVCachedAddress, in.Namespaced = "kvcached", "127.0.0.1:16380", true
		}, "kvcached_address", "not the node's kvcached"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := testInput(baseConfig("vllm", "none", "both"))
			tc.mutate(&in)
			p, err := Render(in)
			must.Nil(t, p)
			must.Error(t, err)
			must.StrContains(t, err.Error(), tc.field+": ")
			must.StrContains(t, err.Error(), tc.want)
		})
	}
}

func TestGPUsFromEnv(t *testing.T) {
	for v, want := range map[string][]string{
		"":               nil,
		"all":            nil,
		"void":           nil,
		"GPU-a":          {"GPU-a"},
		"GPU-a, GPU-b ,": {"GPU-a", "GPU-b"},
	} {
		must.Eq(t, want, GPUsFromEnv(map[string]string{"NVIDIA_VISIBLE_DEVICES": v}))
	}
}

func TestPluginConfigValidate(t *testing.T) {
	p := config.PluginConfig{Binaries: map[string]string{"sim": "/bin/sim"}}
	d, err := p.Validate()
	must.NoError(t, err)
	must.Eq(t, config.DefaultFingerprintEvery, d)
	p = config.PluginConfig{Binaries: map[string]string{"tgi": "/x"}, FingerprintPeriod: "often"}
	_, err = p.Validate()
	must.ErrorContains(t, err, `binaries: unknown engine key "tgi"`)
	must.ErrorContains(t, err, "fingerprint_period")
}

// TestSimRendersLikeVLLM: for every combination, sim's plan is vLLM's with
// only the executable changed.
func TestSimRendersLikeVLLM(t *testing.T) {
	for _, o := range config.Offloads {
		for _, r := range config.Roles {
			sim, serr := Render(testInput(baseConfig(config.EngineSim, o, r)))
			vllm, verr := Render(testInput(baseConfig(config.EngineVLLM, o, r)))
			if verr != nil {
				must.Error(t, serr)
				must.EqOp(t, strings.ReplaceAll(verr.Error(), "vllm", "sim"), serr.Error())
				continue
			}
			must.NoError(t, serr)
			must.EqOp(t, "/opt/engines/oasis-sim", sim.Argv[0])
			must.Eq(t, vllm.Argv[1:], sim.Argv[1:])
			must.Eq(t, vllm.Env, sim.Env)
			must.Eq(t, vllm.Files, sim.Files)
		}
	}
}

// TestBindPorts: where the engine listens and where the driver probes it,
// per network mode and bind_address.
func TestBindPorts(t *testing.T) {
	cases := []struct {
		name       string
		namespaced bool
		bind       string
		ports      map[string]Port
		wantHTTP   Port
		wantHealth string
	}{
		{"host keeps the allocation", false, "", testPorts, Port{HostIP: "10.0.0.5", Value: 20001}, "http://10.0.0.5:20001/health"},
		{"host with bind address", false, "127.0.0.1", testPorts, Port{HostIP: "127.0.0.1", Value: 20001}, "http://127.0.0.1:20001/health"},
		{"bridge binds every interface on to", true, "", bridgePorts, Port{HostIP: "0.0.0.0", Value: 8000}, "http://127.0.0.1:8000/health"},
		{"bridge loopback for a sidecar", true, "127.0.0.1", bridgePorts, Port{HostIP: "127.0.0.1", Value: 8000}, "http://127.0.0.1:8000/health"},
		{"bridge without to keeps the number", true, "", map[string]Port{"http": {HostIP: "10.0.0.5", Value: 20001}, "kv": {Value: 20002, To: 5557}},
			Port{HostIP: "0.0.0.0", Value: 20001}, "http://127.0.0.1:20001/health"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := baseConfig("sim", "none", "both")
			c.BindAddress = tc.bind
			in := testInput(c)
			in.Namespaced, in.Ports = tc.namespaced, tc.ports
			got := bindPorts(c, in)
			must.Eq(t, tc.wantHTTP, got["http"])
			p, err := Render(in)
			must.NoError(t, err)
			must.Eq(t, tc.wantHealth, p.HealthURL)
			must.Eq(t, tc.namespaced, p.HealthInNamespace)
		})
	}
}
