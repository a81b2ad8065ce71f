package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/sim/engine"
	"github.com/oasis-llm/oasis/sim/server"
	"github.com/shoenig/test/must"
)

// The argv Oasis's Nomad driver renders for engine "sim" (nomad-driver/render golden
// files), with every vLLM flag it can render.
func TestParseDriverArgv(t *testing.T) {
	argv := []string{
		"meta-llama/Llama-3.1-8B-Instruct",
		"--host", "10.0.0.5", "--port", "20001",
		"--served-model-name", "meta-llama/Llama-3.1-8B-Instruct",
		"--tensor-parallel-size", "1",
		"--max-model-len", "32768",
		"--gpu-memory-utilization", "0.85",
		"--block-size", "16",
		"--kv-transfer-config", `{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_both"},{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}]}}`,
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://10.0.0.5:20002","topic":"kv-events"}`,
		"--kv-offloading-backend", "native", "--kv-offloading-size", "8",
		"--max-num-seqs", "128", "--max-num-batched-tokens", "4096", "--num-gpu-blocks", "5000", "--seed", "42",
	}
	o, err := Parse(argv)
	must.NoError(t, err)
	must.Eq(t, "meta-llama/Llama-3.1-8B-Instruct", o.Model)
	must.Eq(t, "10.0.0.5", o.Host)
	must.Eq(t, 20001, o.Port)
	must.Eq(t, []string{"meta-llama/Llama-3.1-8B-Instruct"}, o.ServedModelNames)
	must.Eq(t, 32768, o.MaxModelLen)
	must.Eq(t, 16, o.Engine.BlockSize)
	must.Eq(t, 5000, o.Engine.NumGPUBlocks)
	must.Eq(t, 128, o.Engine.MaxNumSeqs)
	must.Eq(t, 4096, o.Engine.MaxNumBatchedTokens)
	must.Eq(t, uint64(42), o.Seed)
	must.NotNil(t, o.KVEvents)
	must.Eq(t, "tcp://10.0.0.5:20002", o.KVEvents.Endpoint)
	must.Eq(t, "kv-events", o.KVEvents.Topic)
	must.StrContains(t, string(o.KVTransfer), "MultiConnector")
	must.Eq(t, []string{"--tensor-parallel-size"}, o.IgnoredFlagNames())
	// 8 GiB of CPU offloading at 2 MiB per 16-token block.
	must.Eq(t, 4096, o.Engine.CPUBlocks)
	must.Eq(t, engine.DefaultTiming(), o.Engine.Timing)
}

func TestParseForms(t *testing.T) {
	o, err := Parse([]string{"--model=m", "--served_model_name", "a", "b", "--port=0", "--no-enable-prefix-caching",
		"--trust-remote-code", "--dtype", "bfloat16", "--some-future-flag", "x", "--enforce-eager", "--max-model-len", "32k",
		"--gpu-memory-utilization", "0.5", "--speed", "0", "--step-time-base", "2ms", "--power-idle-watts", "50",
		"--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"zmq","replay_endpoint":"tcp://*:5558"}`,
		"--kv-events-layout", "array", "-tp", "2", "--api-key", "k1", "--hf-token", "hf_abc"})
	must.NoError(t, err)
	must.Eq(t, "m", o.Model)
	must.Eq(t, []string{"a", "b"}, o.ServedModelNames)
	must.True(t, o.Engine.DisablePrefixCaching)
	must.Eq(t, 32000, o.MaxModelLen)
	must.Eq(t, 0.0, o.Speed)
	must.Eq(t, 2*time.Millisecond, o.Engine.Timing.StepBase)
	must.Eq(t, engine.DefaultTiming().PerPrefillToken, o.Engine.Timing.PerPrefillToken) // other terms keep defaults
	must.Eq(t, 50.0, o.Power.IdleWatts)
	must.Eq(t, 630.0, o.Power.WattsPerUtil)
	must.Eq(t, "tcp://127.0.0.1:5557", o.KVEvents.Endpoint) // vLLM's port, loopback by default
	must.Eq(t, "tcp://*:5558", o.KVEvents.ReplayEndpoint)
	must.Eq(t, kvevents.LayoutArray, o.KVEvents.Layout)
	// 0.5 × 80 GiB − 18 GiB = 22 GiB of KV at 2 MiB per block.
	must.Eq(t, 11264, o.Engine.NumGPUBlocks)
	must.Eq(t, []string{"--dtype", "--enforce-eager", "--hf-token", "--some-future-flag", "--tp", "--trust-remote-code"}, o.IgnoredFlagNames())
	must.Eq(t, "k1", o.APIKey)
	must.SliceContains(t, o.Ignored, "--hf-token <redacted>")

	o, err = Parse([]string{"m", "--kv-events-config", `{"enable_kv_cache_events":false,"publisher":"zmq"}`})
	must.NoError(t, err)
	must.Nil(t, o.KVEvents)
	must.Eq(t, "127.0.0.1", o.Host) // loopback unless told otherwise
	must.Eq(t, 1.0, o.Speed)
}

func TestOffloadingConnectorSizesCPUTier(t *testing.T) {
	o, err := Parse([]string{"m", "--kv-transfer-config",
		`{"kv_connector":"MultiConnector","kv_role":"kv_both","kv_connector_extra_config":{"connectors":[{"kv_connector":"NixlConnector","kv_role":"kv_both"},{"kv_connector":"OffloadingConnector","kv_role":"kv_both","kv_connector_extra_config":{"cpu_bytes_to_use":4294967296}}]}}`})
	must.NoError(t, err)
	must.Eq(t, 2048, o.Engine.CPUBlocks)
	o, err = Parse([]string{"m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`})
	must.NoError(t, err)
	must.Eq(t, 0, o.Engine.CPUBlocks)
	_, err = Parse([]string{"m", "--kv-transfer-config", `[1,2]`})
	must.ErrorContains(t, err, "--kv-transfer-config")
}

func TestParseErrorsNameTheFlag(t *testing.T) {
	cases := []struct {
		args []string
		flag string
	}{
		{[]string{"m", "--port", "http"}, "--port"},
		{[]string{"m", "--port", "70000"}, "--port"},
		{[]string{"m", "--block-size", "0"}, "--block-size"},
		{[]string{"m", "--max-model-len", "lots"}, "--max-model-len"},
		{[]string{"m", "--gpu-memory-utilization", "1.5"}, "--gpu-memory-utilization"},
		{[]string{"m", "--gpu-memory-utilization", "0.1"}, "--gpu-memory-utilization"},
		{[]string{"m", "--tensor-parallel-size", "two"}, "--tensor-parallel-size"},
		{[]string{"m", "--kv-events-config", "{not json"}, "--kv-events-config"},
		{[]string{"m", "--kv-events-config", `{"enable_kv_cache_events":true,"publisher":"kafka"}`}, "--kv-events-config"},
		{[]string{"m", "--kv-transfer-config", `{"kv_connector":`}, "--kv-transfer-config"},
		{[]string{"m", "--kv-offloading-backend", "disk"}, "--kv-offloading-backend"},
		{[]string{"m", "--kv-offloading-size", "big"}, "--kv-offloading-size"},
		{[]string{"m", "--max-num-seqs", "-1"}, "--max-num-seqs"},
		{[]string{"m", "--max-num-batched-tokens", "x"}, "--max-num-batched-tokens"},
		{[]string{"m", "--num-gpu-blocks", "1.5"}, "--num-gpu-blocks"},
		{[]string{"m", "--seed", "s"}, "--seed"},
		{[]string{"m", "--speed", "-1"}, "--speed"},
		{[]string{"m", "--step-time-base", "6"}, "--step-time-base"},
		{[]string{"m", "--power-watts-per-util", "-3"}, "--power-watts-per-util"},
		{[]string{"m", "--max-logprobs", "many"}, "--max-logprobs"},
		{[]string{"m", "--port"}, "--port"},
		{[]string{"m", "--served-model-name"}, "--served-model-name"},
		{[]string{"m", "--lora-modules", "noPath"}, "--lora-modules"},
		{[]string{"m", "--lora-modules", `{"name":"x"}`}, "--lora-modules"},
		{[]string{"m", "--no-enable-prefix-caching=maybe"}, "--no-enable-prefix-caching"},
		{[]string{"m", "--kv-link-gbps", "0"}, "--kv-link-gbps"},
		{[]string{"m", "--kv-bytes-per-token", "big"}, "--kv-bytes-per-token"},
		{[]string{"m", "--kv-hold-timeout", "0s"}, "--kv-hold-timeout"},
		{[]string{"m", "--kv-wait-timeout", "5"}, "--kv-wait-timeout"},
		{[]string{"m", "--disaggregation-mode", "both"}, "--disaggregation-mode"},
		{[]string{"m", "--disaggregation-bootstrap-port", "0"}, "--disaggregation-bootstrap-port"},
		{[]string{"m", "--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_load_failure_policy":"retry"}`}, "--kv-transfer-config"},
	}
	for _, c := range cases {
		_, err := Parse(c.args)
		must.Error(t, err, must.Sprintf("%q", c.args))
		must.StrContains(t, err.Error(), c.flag)
	}
	_, err := Parse([]string{"--port", "1"})
	must.ErrorContains(t, err, "MODEL is required")
	_, err = Parse([]string{"a", "b"})
	must.ErrorContains(t, err, "unexpected arguments")
}

func TestMainVersionAndUsage(t *testing.T) {
	var out, errb bytes.Buffer
	must.Eq(t, 0, Main(context.Background(), []string{"--version"}, &out, &errb))
	must.Eq(t, "oasis-sim "+Version+"\n", out.String())
	out.Reset()
	must.Eq(t, 0, Main(context.Background(), []string{"serve", "m", "--version"}, &out, &errb))
	must.StrContains(t, out.String(), Version)
	must.Eq(t, 2, Main(context.Background(), []string{"serve", "m", "--port", "x"}, &out, &errb))
	must.StrContains(t, errb.String(), "--port")
	must.Eq(t, 2, Main(context.Background(), []string{"frobnicate"}, &out, &errb))
}

func TestServeRunsAndStops(t *testing.T) {
	o, err := Parse([]string{"m", "--port", "0", "--num-gpu-blocks", "100", "--max-model-len", "10000", "--speed", "0"})
	must.NoError(t, err)
	// A max-model-len beyond the KV cache is refused at start, as vLLM does.
	err = Serve(context.Background(), o, hclog.NewNullLogger(), nil)
	must.ErrorContains(t, err, "larger than the KV cache")

	o.MaxModelLen = 0
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o, hclog.NewNullLogger(), ready) }()
	addr := <-ready
	resp, err := http.Post("http://"+addr.String()+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"hi","max_tokens":2}`))
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, 200, resp.StatusCode)
	cancel()
	select {
	case err := <-done:
		must.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not stop")
	}
}

// IgnoredFlagNames returns the sorted names of accepted-but-unmodelled flags.
func (o *Options) IgnoredFlagNames() []string {
	var names []string
	seen := map[string]bool{}
	for _, ig := range o.Ignored {
		n, _, _ := strings.Cut(ig, " ")
		if !seen[n] {
			seen[n] = true
			names = append(names, n)
		}
	}
	sort.Strings(names)
	return names
}

func TestParsePDFlags(t *testing.T) {
	o, err := Parse([]string{"m", "--kv-link-gbps", "100", "--kv-bytes-per-token", "65536", "--kv-hold-timeout", "2m",
		"--kv-wait-timeout", "30s", "--disaggregation-mode", "decode", "--disaggregation-bootstrap-port", "9000",
		"--disaggregation-transfer-backend", "nixl",
		"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":"e1","kv_load_failure_policy":"recompute"}`})
	must.NoError(t, err)
	must.Eq(t, 12.5e9, o.PD.LinkBytesPerSec)
	must.Eq(t, 65536, o.PD.BytesPerToken)
	must.Eq(t, 2*time.Minute, o.PD.HoldTimeout)
	must.Eq(t, 30*time.Second, o.PD.WaitTimeout)
	must.Eq(t, "decode", o.PD.SGLangMode)
	must.Eq(t, 9000, o.BootstrapPort)
	must.Eq(t, "e1", o.PD.EngineID)
	must.Eq(t, "recompute", o.PD.LoadFailurePolicy)

	env := map[string]string{"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.9", "VLLM_NIXL_SIDE_CHANNEL_PORT": "20003"}
	must.NoError(t, o.FromEnv(func(k string) string { return env[k] }))
	must.Eq(t, "10.0.0.9", o.PD.SideChannelHost)
	must.Eq(t, 20003, o.PD.SideChannelPort)
	env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = "nixl"
	must.ErrorContains(t, o.FromEnv(func(k string) string { return env[k] }), "VLLM_NIXL_SIDE_CHANNEL_PORT")

	o, err = Parse([]string{"m"})
	must.NoError(t, err)
	must.NoError(t, o.FromEnv(func(string) string { return "" }))
	must.Eq(t, 5600, o.PD.SideChannelPort) // vLLM's default
	must.Eq(t, 8998, o.BootstrapPort)      // SGLang's default
}

// serve starts Serve on a free port and returns its API address.
func serve(t *testing.T, o *Options) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan net.Addr, 1)
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, o, hclog.NewNullLogger(), ready) }()
	var addr net.Addr
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("Serve: %v", err)
	}
	t.Cleanup(func() { cancel(); <-done })
	return "http://" + addr.String()
}

func postJSON(t *testing.T, url, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	must.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out
}

// Two sims started as the driver starts them move KV over the side channel Serve opens.
func TestServeSideChannels(t *testing.T) {
	args := []string{"m", "--port", "0", "--num-gpu-blocks", "100", "--speed", "0",
		"--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_both"}`}
	p, err := Parse(args)
	must.NoError(t, err)
	p.PD.SideChannelPort = 0 // any free port (the driver renders VLLM_NIXL_SIDE_CHANNEL_PORT)
	d, err := Parse(args)
	must.NoError(t, err)
	d.PD.SideChannelPort = 0
	purl, durl := serve(t, p), serve(t, d)
	code, pre := postJSON(t, purl+"/v1/completions", `{"prompt":"hello there","max_tokens":1,"kv_transfer_params":{"do_remote_decode":true}}`)
	must.Eq(t, 200, code)
	kv, err := json.Marshal(pre["kv_transfer_params"])
	must.NoError(t, err)
	must.StrNotContains(t, string(kv), `"remote_port":0`)
	code, out := postJSON(t, durl+"/v1/completions", `{"prompt":"hello there","max_tokens":3,"kv_transfer_params":`+string(kv)+`}`)
	must.Eq(t, 200, code, must.Sprintf("%v", out))

	// SGLang: a prefill-mode sim serves its bootstrap port.
	port := testutil.FreePort(t)
	sp, err := Parse([]string{"m", "--port", "0", "--num-gpu-blocks", "100", "--speed", "0",
		"--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", strconv.Itoa(port)})
	must.NoError(t, err)
	sd, err := Parse([]string{"m", "--port", "0", "--num-gpu-blocks", "100", "--speed", "0", "--disaggregation-mode", "decode"})
	must.NoError(t, err)
	spurl, sdurl := serve(t, sp), serve(t, sd)
	leg := fmt.Sprintf(`{"prompt":"hello there","max_tokens":3,"bootstrap_host":"127.0.0.1","bootstrap_port":%d,"bootstrap_room":42}`, port)
	code, _ = postJSON(t, spurl+"/v1/completions", leg)
	must.Eq(t, 200, code)
	code, out = postJSON(t, sdurl+"/v1/completions", leg)
	must.Eq(t, 200, code, must.Sprintf("%v", out))
}

// TestParseLoRAModules: vLLM's --lora-modules in both of its forms, several
// values, next to --enable-lora.
func TestParseLoRAModules(t *testing.T) {
	o, err := Parse([]string{"m", "--served-model-name", "m3", "m3-alias", "--enable-lora", "--lora-modules",
		"sql=/a/sql", `{"name":"chat","path":"org/chat","base_model_name":"m3"}`, "--port", "9"})
	must.NoError(t, err)
	must.Eq(t, []string{"m3", "m3-alias"}, o.ServedModelNames)
	must.Eq(t, []server.LoRAModule{{Name: "sql", Path: "/a/sql"}, {Name: "chat", Path: "org/chat"}}, o.LoRAModules)
	must.Eq(t, 9, o.Port)
}
