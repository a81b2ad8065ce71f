package config

import (
	"errors"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// SGLang's --disaggregation-transfer-backend values the driver renders
// (SGLang also has ascend and fake, for NPUs and tests).
var DisaggTransferBackends = []string{"nixl", "mooncake"}

// DefaultDisaggTransferBackend is what a disaggregated SGLang (or
// SGLang-style sim) engine transfers KV with unless the task says otherwise.
const DefaultDisaggTransferBackend = "nixl"

// HiCacheStorageBackends are SGLang's --hicache-storage-backend choices the
// driver renders. "dynamic" (a backend class loaded from a Python module the
// job names) is not one: it would run code of the job's choosing.
var HiCacheStorageBackends = []string{"file", "mooncake", "nixl", "hf3fs", "aibrix", "eic"}

// LLMAPIOptionKeys are the TensorRT-LLM LLM API (TorchLlmArgs) top-level
// options llm_api_options may set: serving, statistics, scheduling and
// cache tuning. Options with nested settings take dotted keys
// ("kv_cache_config.enable_block_reuse"). Parallelism, model and backend
// options are absent: the driver renders them from the task's fields.
var LLMAPIOptionKeys = []string{
	"attn_backend", "batch_wait_timeout_iters", "batch_wait_timeout_ms", "cache_transceiver_config",
	"cuda_graph_config", "disable_overlap_scheduler", "enable_attention_dp", "enable_chunked_prefill",
	"enable_iter_perf_stats", "enable_iter_req_stats", "guided_decoding_backend", "iter_stats_max_iterations",
	"kv_cache_config", "max_batch_size", "max_num_tokens", "moe_config", "print_iter_log",
	"request_stats_max_iterations", "return_perf_metrics", "sampler_type", "scheduler_config",
	"stream_interval",
}

// LLMAPIOwnedKeys are llm_api_options keys the driver renders itself, and
// the task field that sets each.
var LLMAPIOwnedKeys = map[string]string{
	"kv_cache_config.host_cache_size":          "kv_offload_size_gb (with kv_offload = \"native\")",
	"kv_cache_config.free_gpu_memory_fraction": "gpu_memory_utilization",
}

// llmAPIKeyRE is a dotted option path of Python identifiers.
var llmAPIKeyRE = regexp.MustCompile(`^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*){0,3}$`)

// Bounds on llm_api_options: it is written into a YAML file the engine reads.
const (
	maxLLMAPIOptions    = 64
	maxLLMAPIValueBytes = 256
)

// normalizeEngineOptions fills the engine option defaults: TensorRT-LLM's
// iteration statistics on (the router reads its load from them), and the
// NIXL transfer backend for SGLang's disaggregation protocol.
func (c TaskConfig) normalizeEngineOptions() TaskConfig {
	if c.Engine == EngineTRTLLM {
		if _, set := c.LLMAPIOptions["enable_iter_perf_stats"]; !set {
			opts := maps.Clone(c.LLMAPIOptions)
			if opts == nil {
				opts = map[string]string{}
			}
			opts["enable_iter_perf_stats"] = "true"
			c.LLMAPIOptions = opts
		}
	}
	if c.DisaggTransferBackend == "" && c.Disaggregated() &&
		(c.Engine == EngineSGLang || (c.Engine == EngineSim && c.BootstrapPort != "")) {
		c.DisaggTransferBackend = DefaultDisaggTransferBackend
	}
	return c
}

// validateEngineOptions checks llm_api_options,
// disaggregation_transfer_backend and hicache_storage_backend.
func (c TaskConfig) validateEngineOptions() error {
	var errs []error
	if len(c.LLMAPIOptions) > 0 {
		if c.Engine != EngineTRTLLM {
			errs = append(errs, fieldErr("llm_api_options", "TensorRT-LLM's LLM API options; engine %s has none (allowed for: trtllm)", c.Engine))
		} else {
			errs = append(errs, c.validateLLMAPIOptions()...)
		}
	}
	if b := c.DisaggTransferBackend; b != "" {
		sglangProtocol := c.Engine == EngineSGLang || (c.Engine == EngineSim && c.BootstrapPort != "")
		switch {
		case !sglangProtocol || !c.Disaggregated():
			errs = append(errs, fieldErr("disaggregation_transfer_backend", "only used by sglang (or sim with bootstrap_port) with role prefill or decode"))
		case !slices.Contains(DisaggTransferBackends, b):
			errs = append(errs, fieldErr("disaggregation_transfer_backend", "unknown backend %q; allowed: %s", b, strings.Join(DisaggTransferBackends, ", ")))
		}
	}
	if b := c.HiCacheStorageBackend; b != "" {
		switch {
		case c.KVOffload != OffloadHiCache:
			errs = append(errs, fieldErr("hicache_storage_backend", "HiCache's storage tier; set kv_offload = \"hicache\" (engine sglang) to use it"))
		case !slices.Contains(HiCacheStorageBackends, b):
			errs = append(errs, fieldErr("hicache_storage_backend", "unknown backend %q; allowed: %s", b, strings.Join(HiCacheStorageBackends, ", ")))
		}
	}
	return errors.Join(errs...)
}

// validateLLMAPIOptions checks every llm_api_options key and value.
func (c TaskConfig) validateLLMAPIOptions() []error {
	var errs []error
	if len(c.LLMAPIOptions) > maxLLMAPIOptions {
		return []error{fieldErr("llm_api_options", "%d options; at most %d", len(c.LLMAPIOptions), maxLLMAPIOptions)}
	}
	keys := slices.Sorted(maps.Keys(c.LLMAPIOptions))
	for _, k := range keys {
		v := c.LLMAPIOptions[k]
		top, _, _ := strings.Cut(k, ".")
		switch {
		case !llmAPIKeyRE.MatchString(k):
			errs = append(errs, fieldErr("llm_api_options", "key %q is not an option path (lower-case identifiers joined by '.', e.g. kv_cache_config.enable_block_reuse)", k))
		case !slices.Contains(LLMAPIOptionKeys, top):
			errs = append(errs, fieldErr("llm_api_options", "unknown option %q; allowed: %s (nested settings as %s.<name>)", top, strings.Join(LLMAPIOptionKeys, ", "), top))
		case LLMAPIOwnedKeys[k] != "":
			errs = append(errs, fieldErr("llm_api_options", "%q is rendered by the driver from %s", k, LLMAPIOwnedKeys[k]))
		case len(v) > maxLLMAPIValueBytes || strings.ContainsAny(v, "\n\r\x00"):
			errs = append(errs, fieldErr("llm_api_options", "value of %q must be one line of at most %d bytes", k, maxLLMAPIValueBytes))
		}
	}
	// A key that is both a value and a parent ("a" and "a.b") has no YAML form.
	for _, k := range keys {
		for _, other := range keys {
			if strings.HasPrefix(other, k+".") {
				errs = append(errs, fieldErr("llm_api_options", "%q is a value and %q one of its settings; keep one of them", k, other))
			}
		}
	}
	return errs
}
