// Package config holds the llm task driver's plugin and task configuration:
// the hclspec schemas Nomad checks job files against, the Go structs they
// decode into, and the validation that names the offending field and lists
// what is allowed.
package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/oasis-llm/oasis/internal/nomadplugin/hclspec"
)

// Engine names accepted in the task config's "engine" field.
const (
	EngineVLLM         = "vllm"
	EngineSGLang       = "sglang"
	EngineLlamaCpp     = "llama_cpp"
	EngineTRTLLM       = "trtllm"
	EngineOpenAICompat = "openai_compat"
	EngineSim          = "sim"
)

// Roles accepted in "role".
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// KV offload modes accepted in "kv_offload".
const (
	OffloadNone     = "none"
	OffloadNative   = "native"
	OffloadLMCache  = "lmcache"
	OffloadKVCached = "kvcached"
	OffloadNIXL     = "nixl"
	OffloadHiCache  = "hicache"
	OffloadKVBM     = "kvbm"
	OffloadFlexKV   = "flexkv"
)

// Engines, Roles and Offloads list every accepted value in documentation order.
var (
	Engines  = []string{EngineVLLM, EngineSGLang, EngineLlamaCpp, EngineTRTLLM, EngineOpenAICompat, EngineSim}
	Roles    = []string{RoleBoth, RolePrefill, RoleDecode}
	Offloads = []string{OffloadNone, OffloadNative, OffloadLMCache, OffloadKVCached, OffloadNIXL, OffloadHiCache, OffloadKVBM, OffloadFlexKV}
)

// Defaults applied by Normalize.
const (
	DefaultBlockSize        = 16
	DefaultKVCachedAddress  = "127.0.0.1:6380"
	DefaultFingerprintEvery = 30 * time.Second
)

// PluginSpec is the schema of plugin "nomad-driver-llm" { config { ... } }.
var PluginSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	// A block of string attributes: Nomad parses agent configs with HCL1,
	// which turns `binaries = { ... }` into a list of maps that an attribute
	// of type map(string) rejects; block attributes accept both spellings.
	"binaries": hclspec.NewBlockAttrs("binaries", "string", false),
	"fingerprint_period": hclspec.NewDefault(
		hclspec.NewAttr("fingerprint_period", "string", false),
		hclspec.NewLiteral(`"30s"`),
	),
	// What tasks may run (see Policy): their own binary, loader and
	// interpreter variables in extra_env, and the user they run as.
	"allow_task_binary": hclspec.NewDefault(
		hclspec.NewAttr("allow_task_binary", "bool", false),
		hclspec.NewLiteral("false"),
	),
	"allowed_env": hclspec.NewAttr("allowed_env", "list(string)", false),
	"default_user": hclspec.NewDefault(
		hclspec.NewAttr("default_user", "string", false),
		hclspec.NewLiteral(`"`+DefaultUser+`"`),
	),
	// The container runtime that runs tasks with an image (see image.go).
	"container": ContainerSpec,
})

// PluginConfig is the decoded plugin block.
type PluginConfig struct {
	// Binaries maps an engine name to the executable that runs it (for
	// sglang: a Python interpreter, or a launcher script).
	Binaries          map[string]string `codec:"binaries" json:"binaries,omitempty"`
	FingerprintPeriod string            `codec:"fingerprint_period" json:"fingerprint_period,omitempty"`
	// AllowTaskBinary lets tasks name their own executable in `binary`.
	AllowTaskBinary bool `codec:"allow_task_binary" json:"allow_task_binary,omitempty"`
	// AllowedEnv names extra_env variables allowed although RefusedEnv
	// refuses them (LD_PRELOAD, PYTHONPATH, ...).
	AllowedEnv []string `codec:"allowed_env" json:"allowed_env,omitempty"`
	// DefaultUser runs tasks that set no `user` (default "nobody") when
	// the plugin runs as root.
	DefaultUser string `codec:"default_user" json:"default_user,omitempty"`
	// Container names the runtime that runs tasks with an `image`.
	Container ContainerConfig `codec:"container" json:"container,omitempty"`
}

// Validate checks the plugin config and returns the fingerprint period.
func (p *PluginConfig) Validate() (time.Duration, error) {
	var errs []error
	for engine := range p.Binaries {
		if !slices.Contains(Engines, engine) || engine == EngineOpenAICompat {
			errs = append(errs, fieldErr("binaries", "unknown engine key %q; allowed: %s", engine,
				strings.Join(slices.DeleteFunc(slices.Clone(Engines), func(e string) bool { return e == EngineOpenAICompat }), ", ")))
		}
	}
	if err := validateEnvNames(p.AllowedEnv); err != nil {
		errs = append(errs, err)
	}
	if err := validateUser(p.DefaultUser); err != nil {
		errs = append(errs, err)
	}
	if err := p.Container.Validate(); err != nil {
		errs = append(errs, err)
	}
	period := DefaultFingerprintEvery
	if p.FingerprintPeriod != "" {
		d, err := time.ParseDuration(p.FingerprintPeriod)
		switch {
		case err != nil:
			errs = append(errs, fieldErr("fingerprint_period", "%q is not a duration (e.g. \"30s\")", p.FingerprintPeriod))
		case d < time.Second:
			errs = append(errs, fieldErr("fingerprint_period", "%s is shorter than the 1s minimum", d))
		default:
			period = d
		}
	}
	return period, errors.Join(errs...)
}

// TaskSpec is the schema of a task's config block; Nomad's client checks
// types and unknown attributes against it before StartTask is called.
//
// extra_env is a block of attributes, as Nomad's own drivers declare maps
// (docker's storage_opt), not a map(string) attribute: Nomad's HCL job
// parser turns `extra_env = { ... }` into a list of one map, which a
// map(string) attribute refuses; a block decodes from that list and from a
// map (a job submitted as JSON or through the API) alike.
var TaskSpec = hclspec.NewObject(map[string]*hclspec.Spec{
	"engine":                 hclspec.NewAttr("engine", "string", true),
	"model":                  hclspec.NewAttr("model", "string", false),
	"served_model_name":      hclspec.NewAttr("served_model_name", "string", false),
	"served_model_names":     hclspec.NewAttr("served_model_names", "list(string)", false),
	"lora_modules":           hclspec.NewAttr("lora_modules", "list(string)", false),
	"lora_loadable":          hclspec.NewAttr("lora_loadable", "list(string)", false),
	"port":                   hclspec.NewAttr("port", "string", false),
	"bind_address":           hclspec.NewAttr("bind_address", "string", false),
	"tensor_parallel_size":   hclspec.NewAttr("tensor_parallel_size", "number", false),
	"max_model_len":          hclspec.NewAttr("max_model_len", "number", false),
	"gpu_memory_utilization": hclspec.NewAttr("gpu_memory_utilization", "number", false),
	"role":                   hclspec.NewAttr("role", "string", false),
	"kv_offload":             hclspec.NewAttr("kv_offload", "string", false),
	"kv_offload_size_gb":     hclspec.NewAttr("kv_offload_size_gb", "number", false),
	"kv_events":              hclspec.NewAttr("kv_events", "bool", false),
	"kv_events_port":         hclspec.NewAttr("kv_events_port", "string", false),
	"kv_events_replay_port":  hclspec.NewAttr("kv_events_replay_port", "string", false),
	"block_size":             hclspec.NewAttr("block_size", "number", false),
	"kvcached_address":       hclspec.NewAttr("kvcached_address", "string", false),
	"nixl_side_channel_port": hclspec.NewAttr("nixl_side_channel_port", "string", false),
	"bootstrap_port":         hclspec.NewAttr("bootstrap_port", "string", false),
	"endpoint":               hclspec.NewAttr("endpoint", "string", false),
	"health_timeout":         hclspec.NewAttr("health_timeout", "string", false),
	"otlp_traces_endpoint":   hclspec.NewAttr("otlp_traces_endpoint", "string", false),
	"extra_args":             hclspec.NewAttr("extra_args", "list(string)", false),
	"extra_env":              hclspec.NewBlockAttrs("extra_env", "string", false),
	// llm_api_options is a block of attributes for the same reason as extra_env.
	"llm_api_options":                 hclspec.NewBlockAttrs("llm_api_options", "string", false),
	"disaggregation_transfer_backend": hclspec.NewAttr("disaggregation_transfer_backend", "string", false),
	"hicache_storage_backend":         hclspec.NewAttr("hicache_storage_backend", "string", false),
	"kv_offload_tier":                 hclspec.NewAttr("kv_offload_tier", "string", false),
	"binary":                          hclspec.NewAttr("binary", "string", false),
	"image":                           hclspec.NewAttr("image", "string", false),
	"auth":                            AuthSpec,
})

// TaskConfig is a task's decoded config block. Zero values mean "not set";
// Normalize fills in defaults.
type TaskConfig struct {
	Engine          string `codec:"engine" json:"engine,omitempty"`
	Model           string `codec:"model" json:"model,omitempty"`
	ServedModelName string `codec:"served_model_name" json:"served_model_name,omitempty"`
	// ServedModelNames are further names the engine serves the model under
	// (vLLM's --served-model-name after the first); LoRAModules the LoRA
	// adapters it serves, "name=path" (--enable-lora --lora-modules). The
	// job's service meta oasis_served_names / oasis_lora_adapters lists the
	// same names for the router.
	ServedModelNames []string `codec:"served_model_names" json:"served_model_names,omitempty"`
	LoRAModules      []string `codec:"lora_modules" json:"lora_modules,omitempty"`
	// LoRALoadable are adapters ("name=path") the router may load at run
	// time: the engine runs with --enable-lora and
	// VLLM_ALLOW_RUNTIME_LORA_UPDATING; the service meta
	// oasis_lora_loadable lists the same entries.
	LoRALoadable []string `codec:"lora_loadable" json:"lora_loadable,omitempty"`
	Port         string   `codec:"port" json:"port,omitempty"`
	// BindAddress is the address the engine listens on. Unset: the port's
	// allocated host address in host networking, every interface inside a
	// bridge network namespace. "127.0.0.1" in bridge networking leaves the
	// engine reachable only from its own allocation (a Connect sidecar).
	BindAddress          string `codec:"bind_address" json:"bind_address,omitempty"`
	TensorParallelSize   int    `codec:"tensor_parallel_size" json:"tensor_parallel_size,omitempty"`
	MaxModelLen          int    `codec:"max_model_len" json:"max_model_len,omitempty"`
	GPUMemoryUtilization Float  `codec:"gpu_memory_utilization" json:"gpu_memory_utilization,omitempty"`
	Role                 string `codec:"role" json:"role,omitempty"`
	KVOffload            string `codec:"kv_offload" json:"kv_offload,omitempty"`
	KVOffloadSizeGB      Float  `codec:"kv_offload_size_gb" json:"kv_offload_size_gb,omitempty"`
	// KVEvents is a pointer so that "unset" (default on where the engine
	// publishes events) differs from an explicit false.
	KVEvents     *bool  `codec:"kv_events" json:"kv_events,omitempty"`
	KVEventsPort string `codec:"kv_events_port" json:"kv_events_port,omitempty"`
	// KVEventsReplayPort labels the port of the engine's replay socket (a ZMQ
	// ROUTER re-sending buffered event batches from a sequence number), so a
	// subscriber that missed batches fills the gap instead of resynchronising.
	KVEventsReplayPort  string            `codec:"kv_events_replay_port" json:"kv_events_replay_port,omitempty"`
	BlockSize           int               `codec:"block_size" json:"block_size,omitempty"`
	KVCachedAddress     string            `codec:"kvcached_address" json:"kvcached_address,omitempty"`
	NIXLSideChannelPort string            `codec:"nixl_side_channel_port" json:"nixl_side_channel_port,omitempty"`
	BootstrapPort       string            `codec:"bootstrap_port" json:"bootstrap_port,omitempty"`
	Endpoint            string            `codec:"endpoint" json:"endpoint,omitempty"`
	HealthTimeout       string            `codec:"health_timeout" json:"health_timeout,omitempty"`
	ExtraArgs           []string          `codec:"extra_args" json:"extra_args,omitempty"`
	ExtraEnv            map[string]string `codec:"extra_env" json:"extra_env,omitempty"`
	Binary              string            `codec:"binary" json:"binary,omitempty"`
	// Image runs the engine from a container image instead of a host
	// binary (see image.go); Auth holds the registry credentials.
	Image string     `codec:"image" json:"image,omitempty"`
	Auth  *ImageAuth `codec:"auth" json:"auth,omitempty"`
	// OTLPTracesEndpoint is where the engine exports its request traces
	// (vLLM's --otlp-traces-endpoint): http(s)://host:port[/path] for
	// OTLP/HTTP (path default /v1/traces), grpc://host:port for OTLP/gRPC.
	// The router's traceparent makes the engine's spans children of its
	// upstream attempt.
	OTLPTracesEndpoint string `codec:"otlp_traces_endpoint" json:"otlp_traces_endpoint,omitempty"`
	// LLMAPIOptions are TensorRT-LLM LLM API options (its
	// --extra_llm_api_options YAML): dotted keys ("kv_cache_config.dtype")
	// to scalar values; see engineopts.go.
	LLMAPIOptions map[string]string `codec:"llm_api_options" json:"llm_api_options,omitempty"`
	// DisaggTransferBackend is SGLang's --disaggregation-transfer-backend
	// (nixl, mooncake) for role prefill/decode.
	DisaggTransferBackend string `codec:"disaggregation_transfer_backend" json:"disaggregation_transfer_backend,omitempty"`
	// HiCacheStorageBackend is SGLang's --hicache-storage-backend: HiCache's
	// third tier behind host memory (kv_offload = "hicache").
	HiCacheStorageBackend string `codec:"hicache_storage_backend" json:"hicache_storage_backend,omitempty"`
	// KVOffloadTier names a tier declared in Nomad variables (tier.go): the
	// driver renders kv_offload, its address, size and secret from it.
	KVOffloadTier string `codec:"kv_offload_tier" json:"kv_offload_tier,omitempty"`
}

// FieldError is a validation error about one task config field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)}
}

// Normalize returns a copy with defaults filled in: role both, offload none,
// served name = model, TP 1, block size 16 where the engine has one, the
// node-local kvcached address, and KV events on where the engine publishes them.
func (c TaskConfig) Normalize() TaskConfig {
	if c.Role == "" {
		c.Role = RoleBoth
	}
	if c.KVOffload == "" {
		c.KVOffload = OffloadNone
	}
	if c.ServedModelName == "" {
		c.ServedModelName = c.Model
	}
	if c.TensorParallelSize == 0 {
		c.TensorParallelSize = 1
	}
	if c.BlockSize == 0 && HasBlockSize(c.Engine) {
		c.BlockSize = DefaultBlockSize
	}
	if c.KVCachedAddress == "" && c.KVOffload == OffloadKVCached {
		c.KVCachedAddress = DefaultKVCachedAddress
	}
	if c.KVEvents == nil {
		on := SupportsKVEvents(c.Engine)
		c.KVEvents = &on
	}
	return c.normalizeEngineOptions()
}

// EventsOn reports whether KV events are enabled (after Normalize).
func (c TaskConfig) EventsOn() bool { return c.KVEvents != nil && *c.KVEvents }

// SupportsKVEvents reports whether the driver renders ZMQ KV events for engine.
func SupportsKVEvents(engine string) bool {
	switch engine {
	case EngineVLLM, EngineSim, EngineSGLang:
		return true
	}
	return false
}

// HasBlockSize reports whether the engine takes a KV block (page) size flag.
func HasBlockSize(engine string) bool {
	switch engine {
	case EngineVLLM, EngineSim, EngineSGLang:
		return true
	}
	return false
}

// IsGPUEngine reports whether the engine needs reserved GPUs for its
// tensor-parallel ranks. llama.cpp runs on CPU too; sim and openai_compat need none.
func IsGPUEngine(engine string) bool {
	switch engine {
	case EngineVLLM, EngineSGLang, EngineTRTLLM:
		return true
	}
	return false
}

// Disaggregated reports whether the role is one half of a prefill/decode pair.
func (c TaskConfig) Disaggregated() bool { return c.Role == RolePrefill || c.Role == RoleDecode }

// SGLangStyleSim reports whether a disaggregated sim runs SGLang's protocol
// (bootstrap_port set: --disaggregation-mode and bootstrap rooms) instead of
// vLLM's NIXL handshake (nixl_side_channel_port set).
func (c TaskConfig) SGLangStyleSim() bool {
	return c.Engine == EngineSim && c.Disaggregated() && c.BootstrapPort != ""
}

// checkDisaggPorts checks nixl_side_channel_port and bootstrap_port: vLLM halves
// need the side channel, SGLang prefill servers the bootstrap port, and sim halves
// one of the two, which selects the protocol it serves.
func (c TaskConfig) checkDisaggPorts() []error {
	var errs []error
	if c.Engine == EngineSim && c.Disaggregated() {
		switch {
		case c.NIXLSideChannelPort == "" && c.BootstrapPort == "":
			errs = append(errs, fieldErr("nixl_side_channel_port", "role %q on engine sim needs a port label: nixl_side_channel_port (vLLM's NIXL protocol) or bootstrap_port (SGLang's)", c.Role))
		case c.NIXLSideChannelPort != "" && c.BootstrapPort != "":
			errs = append(errs, fieldErr("bootstrap_port", "engine sim serves one protocol: set nixl_side_channel_port (vLLM) or bootstrap_port (SGLang), not both"))
		}
		return errs
	}
	usesNIXLSideChannel := c.Disaggregated() && c.Engine == EngineVLLM
	if usesNIXLSideChannel && c.NIXLSideChannelPort == "" {
		errs = append(errs, fieldErr("nixl_side_channel_port", "role %q on engine %s transfers KV over NIXL and needs a port label for its side channel", c.Role, c.Engine))
	}
	if !usesNIXLSideChannel && c.NIXLSideChannelPort != "" {
		errs = append(errs, fieldErr("nixl_side_channel_port", "only used by vllm/sim with role prefill or decode"))
	}
	usesBootstrap := c.Engine == EngineSGLang && c.Role == RolePrefill
	if usesBootstrap && c.BootstrapPort == "" {
		errs = append(errs, fieldErr("bootstrap_port", "sglang prefill servers need a port label for --disaggregation-bootstrap-port"))
	}
	if !usesBootstrap && c.BootstrapPort != "" {
		errs = append(errs, fieldErr("bootstrap_port", "only used by sglang with role prefill, or by sim with role prefill or decode"))
	}
	return errs
}

// HealthTimeoutOrDefault is how long the driver waits for the engine's
// health endpoint before reporting "health failing" (default 15 minutes:
// large models take long to load).
func (c TaskConfig) HealthTimeoutOrDefault() time.Duration {
	if d, err := time.ParseDuration(c.HealthTimeout); err == nil && d > 0 {
		return d
	}
	return 15 * time.Minute
}

// Validate checks a normalized config on its own (no ports or devices) and
// returns every problem found, each naming its field and what is allowed.
func (c TaskConfig) Validate() error {
	var errs []error
	add := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}

	if !slices.Contains(Engines, c.Engine) {
		add(fieldErr("engine", "unknown engine %q; allowed: %s", c.Engine, strings.Join(Engines, ", ")))
		return errors.Join(errs...)
	}
	if !slices.Contains(Roles, c.Role) {
		add(fieldErr("role", "unknown role %q; allowed: %s", c.Role, strings.Join(Roles, ", ")))
	}
	if !slices.Contains(Offloads, c.KVOffload) {
		add(fieldErr("kv_offload", "unknown kv_offload %q; allowed: %s", c.KVOffload, strings.Join(Offloads, ", ")))
	}
	if len(errs) == 0 {
		add(CheckCombination(c.Engine, c.KVOffload, c.Role))
	}

	if strings.TrimSpace(c.Model) == "" {
		add(fieldErr("model", "is required (a model name or path the engine loads; for openai_compat the remote model name)"))
	}

	if c.Engine == EngineOpenAICompat {
		add(validateEndpoint(c.Endpoint))
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"port", c.Port != ""},
			{"bind_address", c.BindAddress != ""},
			{"tensor_parallel_size", c.TensorParallelSize != 1},
			{"max_model_len", c.MaxModelLen != 0},
			{"gpu_memory_utilization", c.GPUMemoryUtilization != 0},
			{"kv_offload_size_gb", c.KVOffloadSizeGB != 0},
			{"kv_events_port", c.KVEventsPort != ""},
			{"kv_events_replay_port", c.KVEventsReplayPort != ""},
			{"block_size", c.BlockSize != 0},
			{"nixl_side_channel_port", c.NIXLSideChannelPort != ""},
			{"bootstrap_port", c.BootstrapPort != ""},
			{"extra_args", len(c.ExtraArgs) != 0},
			{"extra_env", len(c.ExtraEnv) != 0},
			{"binary", c.Binary != ""},
			{"image", c.Image != ""},
			{"otlp_traces_endpoint", c.OTLPTracesEndpoint != ""},
			{"llm_api_options", len(c.LLMAPIOptions) != 0},
			{"disaggregation_transfer_backend", c.DisaggTransferBackend != ""},
			{"hicache_storage_backend", c.HiCacheStorageBackend != ""},
			{"kv_offload_tier", c.KVOffloadTier != ""},
		} {
			if f.set {
				add(fieldErr(f.name, "not used by engine openai_compat, which runs no process (it only checks endpoint)"))
			}
		}
		if c.EventsOn() {
			add(fieldErr("kv_events", "engine openai_compat publishes no KV events; remove kv_events or set it to false"))
		}
		return errors.Join(errs...)
	}

	add(c.validateOTLP())
	add(c.validateImage())
	add(c.validateEngineOptions())
	add(c.validateTierField())
	errs = append(errs, c.validateNames()...)
	if c.Endpoint != "" {
		add(fieldErr("endpoint", "only used by engine openai_compat; engine %s serves on the port label in \"port\"", c.Engine))
	}
	if c.BindAddress != "" && net.ParseIP(c.BindAddress) == nil {
		add(fieldErr("bind_address", "%q is not an IP address (e.g. \"127.0.0.1\" or \"0.0.0.0\")", c.BindAddress))
	}
	if c.Port == "" {
		add(fieldErr("port", "is required: the label of a port in the group's network block (e.g. port = \"http\")"))
	}
	if c.TensorParallelSize < 1 {
		add(fieldErr("tensor_parallel_size", "must be at least 1, got %d", c.TensorParallelSize))
	}
	if c.Engine == EngineLlamaCpp && c.TensorParallelSize != 1 {
		add(fieldErr("tensor_parallel_size", "engine llama_cpp has no tensor parallelism (it spreads layers over all visible GPUs); allowed: 1"))
	}
	if c.MaxModelLen < 0 {
		add(fieldErr("max_model_len", "must not be negative, got %d", c.MaxModelLen))
	}
	if c.GPUMemoryUtilization < 0 || c.GPUMemoryUtilization > 1 {
		add(fieldErr("gpu_memory_utilization", "must be in (0, 1], got %g", c.GPUMemoryUtilization))
	}
	if c.GPUMemoryUtilization != 0 && c.Engine == EngineLlamaCpp {
		add(fieldErr("gpu_memory_utilization", "not supported by engine llama_cpp"))
	}
	if c.ServedModelName != c.Model && c.Engine == EngineTRTLLM {
		add(fieldErr("served_model_name", "engine trtllm serves the model under its own name; leave served_model_name unset or equal to model"))
	}
	if c.BlockSize < 0 || (c.BlockSize != 0 && !HasBlockSize(c.Engine)) {
		if c.BlockSize < 0 {
			add(fieldErr("block_size", "must be positive, got %d", c.BlockSize))
		} else {
			add(fieldErr("block_size", "not rendered for engine %s; allowed for: vllm, sglang, sim", c.Engine))
		}
	}
	if c.BlockSize > 0 && c.BlockSize&(c.BlockSize-1) != 0 && (c.Engine == EngineVLLM || c.Engine == EngineSim) {
		add(fieldErr("block_size", "vLLM block sizes are powers of two, got %d", c.BlockSize))
	}

	// KV events.
	if c.EventsOn() {
		if !SupportsKVEvents(c.Engine) {
			add(fieldErr("kv_events", "engine %s publishes no ZMQ KV events; allowed for: vllm, sglang, sim", c.Engine))
		} else if c.KVEventsPort == "" {
			add(fieldErr("kv_events_port", "engine %s publishes KV events by default and needs a port label for its ZMQ endpoint; set kv_events_port (e.g. \"kv\") or kv_events = false", c.Engine))
		}
	} else if c.KVEventsPort != "" {
		add(fieldErr("kv_events_port", "set while kv_events = false; remove one of them"))
	}
	if c.KVEventsReplayPort != "" {
		switch {
		case !c.EventsOn() && SupportsKVEvents(c.Engine):
			add(fieldErr("kv_events_replay_port", "set while kv_events = false; the replay socket serves the events' buffer, so remove it or turn kv_events on"))
		case !SupportsKVEvents(c.Engine):
			add(fieldErr("kv_events_replay_port", "engine %s publishes no ZMQ KV events to replay; allowed for: vllm, sglang, sim", c.Engine))
		case c.KVEventsReplayPort == c.KVEventsPort:
			add(fieldErr("kv_events_replay_port", "%q is also kv_events_port; the replay socket needs its own port label", c.KVEventsReplayPort))
		}
	}

	// Offload sizing.
	switch c.KVOffload {
	case OffloadNative, OffloadLMCache, OffloadKVBM, OffloadFlexKV:
		if c.KVOffloadSizeGB <= 0 {
			add(fieldErr("kv_offload_size_gb", "kv_offload = %q needs the CPU cache size in GiB (> 0)", c.KVOffload))
		}
	case OffloadKVCached, OffloadHiCache:
		if c.KVOffloadSizeGB < 0 {
			add(fieldErr("kv_offload_size_gb", "must not be negative, got %g", c.KVOffloadSizeGB))
		}
	default:
		if c.KVOffloadSizeGB != 0 {
			add(fieldErr("kv_offload_size_gb", "set while kv_offload = %q offloads nothing; allowed with: native, lmcache, kvcached, hicache, kvbm, flexkv", c.KVOffload))
		}
	}
	if c.KVOffload == OffloadKVCached && c.KVCachedAddress != "" {
		if _, _, err := splitHostPort(c.KVCachedAddress); err != nil {
			add(fieldErr("kvcached_address", "%q is not host:port: %v", c.KVCachedAddress, err))
		}
	} else if c.KVOffload != OffloadKVCached && c.KVCachedAddress != "" {
		add(fieldErr("kvcached_address", "only used with kv_offload = \"kvcached\""))
	}

	// Disaggregation ports.
	for _, err := range c.checkDisaggPorts() {
		add(err)
	}

	if c.HealthTimeout != "" {
		if d, err := time.ParseDuration(c.HealthTimeout); err != nil || d <= 0 {
			add(fieldErr("health_timeout", "%q is not a positive duration (e.g. \"10m\")", c.HealthTimeout))
		}
	}
	for k := range c.ExtraEnv {
		if k == "" || strings.ContainsAny(k, "= \t\n") {
			add(fieldErr("extra_env", "invalid variable name %q", k))
		}
	}
	return errors.Join(errs...)
}

// validateOTLP checks otlp_traces_endpoint: vLLM only, an http(s):// or
// grpc:// URL with host and port.
func (c TaskConfig) validateOTLP() error {
	e := c.OTLPTracesEndpoint
	if e == "" {
		return nil
	}
	if c.Engine != EngineVLLM {
		return fieldErr("otlp_traces_endpoint", "engine %s exports no traces the driver can configure; allowed for: vllm", c.Engine)
	}
	u, err := url.Parse(e)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https" && u.Scheme != "grpc") || u.Port() == "" || u.Hostname() == "" {
		return fieldErr("otlp_traces_endpoint", "%q is not an OTLP receiver URL with host and port: http(s)://host:4318[/v1/traces] (OTLP/HTTP) or grpc://host:4317 (OTLP/gRPC)", e)
	}
	if u.Scheme == "grpc" && u.Path != "" && u.Path != "/" {
		return fieldErr("otlp_traces_endpoint", "%q: an OTLP/gRPC endpoint has no path", e)
	}
	return nil
}

func validateEndpoint(endpoint string) error {
	if endpoint == "" {
		return fieldErr("endpoint", "is required for engine openai_compat: the remote API base URL, e.g. \"https://api.example.com/v1\"")
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fieldErr("endpoint", "%q is not an http(s) URL with a host", endpoint)
	}
	return nil
}

func splitHostPort(addr string) (string, string, error) {
	i := strings.LastIndexByte(addr, ':')
	if i <= 0 || i == len(addr)-1 {
		return "", "", errors.New("missing host or port")
	}
	return addr[:i], addr[i+1:], nil
}
