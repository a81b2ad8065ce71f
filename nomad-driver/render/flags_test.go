package render

import (
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// TestOwnedFlagSpellings: extra_args may not set a flag the driver renders
// under any spelling the engine's parser accepts. vLLM and SGLang (argparse,
// allow_abbrev on, '_' read as '-') take underscores and unambiguous
// prefixes; llama.cpp's parser and trtllm-serve's (Click) match exactly, so
// there a prefix is an unknown flag of the engine's, not the driver's.
func TestOwnedFlagSpellings(t *testing.T) {
	cases := []struct {
		engine, arg string
		owned       string // the flag it is refused as; "" = passed through
	}{
		{config.EngineVLLM, "--port", "--port"},
		{config.EngineVLLM, "--port=9", "--port"},
		{config.EngineVLLM, "--served_model_name", "--served-model-name"},
		{config.EngineVLLM, "--served_model_name=x", "--served-model-name"},
		{config.EngineVLLM, "--hos", "--host"},
		{config.EngineVLLM, "--hos=0.0.0.0", "--host"},
		{config.EngineVLLM, "--served-model", "--served-model-name"},
		{config.EngineVLLM, "--tensor_parallel", "--tensor-parallel-size"},
		{config.EngineVLLM, "--kv-events", "--kv-events-config"},
		{config.EngineVLLM, "--gpu_mem", "--gpu-memory-utilization"},
		{config.EngineVLLM, "--config", "--config"},
		{config.EngineVLLM, "-tp", "-tp"},
		{config.EngineSim, "--max_model_len", "--max-model-len"},
		{config.EngineSim, "--blo", "--block-size"},
		{config.EngineVLLM, "--max-num-seqs", ""},
		{config.EngineVLLM, "--max_num_seqs", ""},
		{config.EngineVLLM, "--hostname-extra", ""},
		{config.EngineVLLM, "--", ""},
		{config.EngineVLLM, "-1", ""},
		{config.EngineVLLM, "value", ""},
		{config.EngineVLLM, "--enable-prefix-caching", ""},
		{config.EngineSGLang, "--model_path", "--model-path"},
		{config.EngineSGLang, "--page", "--page-size"},
		{config.EngineSGLang, "--disaggregation_bootstrap", "--disaggregation-bootstrap-port"},
		{config.EngineSGLang, "--mem-fraction", "--mem-fraction-static"},
		{config.EngineSGLang, "--tp", "--tp"},
		{config.EngineSGLang, "--schedule-policy", ""},
		{config.EngineLlamaCpp, "--port", "--port"},
		{config.EngineLlamaCpp, "-ngl", "-ngl"},
		{config.EngineLlamaCpp, "--hos", ""},
		{config.EngineLlamaCpp, "--ctx_size", ""},
		{config.EngineLlamaCpp, "--threads", ""},
		{config.EngineTRTLLM, "--tp_size", "--tp_size"},
		{config.EngineTRTLLM, "--tp", "--tp"}, // Click alias of --tp_size
		{config.EngineTRTLLM, "--t", ""},
		{config.EngineTRTLLM, "--max_batch_size", ""},
	}
	for _, tc := range cases {
		t.Run(tc.engine+" "+tc.arg, func(t *testing.T) {
			c := config.TaskConfig{Engine: tc.engine, Model: "m", Port: "http", KVEventsPort: "kv",
				ExtraArgs: []string{"--seed", "1", tc.arg}}
			if !config.SupportsKVEvents(tc.engine) {
				c.KVEventsPort = ""
			}
			_, err := Render(testInput(c))
			if tc.owned == "" {
				must.NoError(t, err)
				return
			}
			must.ErrorContains(t, err, "extra_args: ")
			must.ErrorContains(t, err, "is rendered by the driver from the task config")
			if name, _, _ := strings.Cut(tc.arg, "="); name != tc.owned {
				must.ErrorContains(t, err, "the engine reads it as "+tc.owned)
			}
		})
	}
}
