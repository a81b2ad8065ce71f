// Package render turns a task's config, its allocated ports and its
// reserved GPUs into the exact command line, environment and files an
// inference engine is started with. Render is pure: no I/O, no clock, so
// every engine × kv_offload × role combination is pinned by a golden file.
package render

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// Port is one allocated port of the task's group network.
type Port struct {
	HostIP string
	Value  int
	// To is Nomad's mapped port: what the task listens on inside the
	// allocation's own network namespace (bridge mode). Zero or -1 means the
	// same number as Value, as in Nomad.
	To int
}

// inside returns the port number the engine binds in a group namespace.
func (p Port) inside() int {
	if p.To > 0 {
		return p.To
	}
	return p.Value
}

// NamespaceBindAddress is what an engine in the group's own network
// namespace binds when bind_address is unset: every interface, so the
// mapped host port (through the bridge) and a sidecar (on loopback) both
// reach it.
const NamespaceBindAddress = "0.0.0.0"

// Input is everything a rendering depends on.
type Input struct {
	// Config is the task's config block as decoded; Render normalizes it.
	Config config.TaskConfig
	// Binary is the resolved engine executable (for sglang a Python
	// interpreter or a launcher); empty renders the engine's default name.
	Binary string
	// Ports maps the group network's port labels to their allocation.
	Ports map[string]Port
	// GPUs are the device ids the device plugin reserved for the task (its
	// NVIDIA_VISIBLE_DEVICES); see GPUsFromEnv.
	GPUs []string
	// LocalDir is the task's local directory, where files are written.
	LocalDir string
	// Namespaced is true when the task runs in the allocation's own network
	// namespace (network mode "bridge" or "cni/..."): the engine then binds
	// each port's To inside it, and its health is probed from inside it.
	Namespaced bool
	// Policy is what the client's plugin config lets the task run (its own
	// binary, extra_env's loader variables, root); the zero value allows
	// none of them.
	Policy config.Policy
	// User is the task's own `user` ("" when unset).
	User string
	// SecretsDir is the task's secrets directory, where files holding a
	// secret are written.
	SecretsDir string
	// Tier is the declaration of the task's kv_offload_tier, with its
	// secret, as read when the task starts (nil without kv_offload_tier).
	Tier *config.Tier

	// nodeIP is the node's address (the API port's host IP), which a tier's
	// ${node.ip} stands for; Render sets it before rebinding ports.
	nodeIP string
}

// File is a file written into the task's local directory before start.
type File struct {
	Path    string // absolute path (LocalDir or SecretsDir joined with the name)
	Content []byte
	// Secret files hold a password: written 0600, owned by the engine's
	// account, into the secrets directory.
	Secret bool
}

// Plan is what the driver launches.
type Plan struct {
	// Config is the normalized config the plan was rendered from (with
	// kv_offload_tier's fields rendered and the field itself cleared).
	Config config.TaskConfig
	// Tier is the kv_offload_tier the plan was rendered from ("" for none).
	Tier string
	// NoProcess is true for openai_compat: nothing is launched, HealthURL is watched.
	NoProcess bool
	Argv      []string
	// Env holds the variables the driver adds to (and overrides in) the task env.
	Env   map[string]string
	Files []File
	// HealthURL answers 200 when the engine is ready.
	HealthURL string
	// HealthInNamespace is true when HealthURL is an address inside the
	// allocation's network namespace: the driver must dial it from there.
	HealthInNamespace bool
	// MetricsPath is where the engine serves Prometheus metrics.
	MetricsPath string
	// KVEventsEndpoint is the ZMQ PUB endpoint, empty when events are off.
	KVEventsEndpoint string
	// KVEventsReplayEndpoint is the ZMQ ROUTER replay endpoint, empty without
	// kv_events_replay_port.
	KVEventsReplayEndpoint string
}

// DefaultBinary is the executable looked up on PATH when neither the task
// nor the plugin config names one.
func DefaultBinary(engine string) string {
	switch engine {
	case config.EngineVLLM:
		return "vllm"
	case config.EngineSGLang:
		return "python3"
	case config.EngineLlamaCpp:
		return "llama-server"
	case config.EngineTRTLLM:
		return "trtllm-serve"
	case config.EngineSim:
		return "oasis-sim"
	}
	return ""
}

// GPUsFromEnv returns the device ids in NVIDIA_VISIBLE_DEVICES; "all",
// "none", "void" and empty reserve nothing countable.
func GPUsFromEnv(env map[string]string) []string {
	v := strings.TrimSpace(env["NVIDIA_VISIBLE_DEVICES"])
	switch v {
	case "", "none", "void", "all":
		return nil
	}
	var ids []string
	for _, id := range strings.Split(v, ",") {
		if id = strings.TrimSpace(id); id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// lmcacheChunkSize is LMCache's default chunk (tokens), used where chunks
// cannot line up with the engine's blocks (SGLang).
const lmcacheChunkSize = 256

// File names written into the task's local directory.
const (
	LMCacheConfigName = "lmcache.yaml"
	TRTLLMOptionsName = "extra_llm_api_options.yaml"
)

// Render validates the input and renders the engine's launch plan. Every
// error names the field at fault and what is allowed.
func Render(in Input) (*Plan, error) {
	c := in.Config.Normalize()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if err := c.CheckPolicy(in.Policy, in.User); err != nil {
		return nil, err
	}
	if err := checkRuntime(c, in); err != nil {
		return nil, err
	}
	if err := checkExtraArgs(c); err != nil {
		return nil, err
	}
	in.nodeIP = connectHost(in.Ports[c.Port].HostIP)
	tier := c.KVOffloadTier
	if tier != "" {
		var err error
		if c, err = applyTier(c, in); err != nil {
			return nil, err
		}
	}

	p := &Plan{Config: c, Tier: tier, Env: map[string]string{}, MetricsPath: "/metrics"}
	if c.Engine == config.EngineOpenAICompat {
		p.NoProcess = true
		p.HealthURL = strings.TrimRight(c.Endpoint, "/") + "/models"
		return p, nil
	}

	in.Ports = bindPorts(c, in)
	port := in.Ports[c.Port]
	host := port.HostIP
	p.HealthURL = "http://" + net.JoinHostPort(connectHost(host), strconv.Itoa(port.Value)) + "/health"
	p.HealthInNamespace = in.Namespaced
	if c.EventsOn() {
		ev := in.Ports[c.KVEventsPort]
		p.KVEventsEndpoint = "tcp://" + net.JoinHostPort(ev.HostIP, strconv.Itoa(ev.Value))
		if c.KVEventsReplayPort != "" {
			rp := in.Ports[c.KVEventsReplayPort]
			p.KVEventsReplayEndpoint = "tcp://" + net.JoinHostPort(rp.HostIP, strconv.Itoa(rp.Value))
		}
	}
	if len(in.GPUs) > 0 {
		p.Env["CUDA_VISIBLE_DEVICES"] = strings.Join(in.GPUs, ",")
	}
	for k, v := range c.ExtraEnv {
		p.Env[k] = v
	}

	bin := in.Binary
	if bin == "" {
		bin = DefaultBinary(c.Engine)
	}
	var err error
	switch c.Engine {
	case config.EngineVLLM, config.EngineSim:
		err = renderVLLM(p, c, in, bin, host, port.Value)
	case config.EngineSGLang:
		err = renderSGLang(p, c, in, bin, host, port.Value)
	case config.EngineLlamaCpp:
		renderLlamaCpp(p, c, in, bin, host, port.Value)
	case config.EngineTRTLLM:
		renderTRTLLM(p, c, in, bin, host, port.Value)
	}
	if err != nil {
		return nil, err
	}
	p.Argv = append(p.Argv, c.ExtraArgs...)
	return p, nil
}

// applyTier renders kv_offload_tier's fields from the tier's declaration
// (for the node whose address the API port's allocation carries) and
// validates the result as a task config of its own.
func applyTier(c config.TaskConfig, in Input) (config.TaskConfig, error) {
	c, err := c.WithTier(in.Tier, in.nodeIP)
	if err != nil {
		return c, err
	}
	c = c.Normalize()
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("kv_offload_tier: tier %q renders an invalid config: %w", in.Tier.Name, err)
	}
	if in.Namespaced {
		if errs := checkNamespaced(c); len(errs) > 0 {
			return c, fmt.Errorf("kv_offload_tier: tier %q: %w", in.Tier.Name, errors.Join(errs...))
		}
	}
	return c, nil
}

// bindPorts returns the address:port each label is bound at by the engine.
// In host mode that is the allocation (HostIP:Value); in a group namespace
// it is NamespaceBindAddress and the mapped To port, because Nomad's portmap
// forwards HostIP:Value to it and a Connect sidecar dials 127.0.0.1:To.
// bind_address overrides the address of the API's port only: a mesh engine
// bound to loopback keeps its KV-event publishers on the mapped ports, so
// routers outside the mesh's data path still subscribe to them.
func bindPorts(c config.TaskConfig, in Input) map[string]Port {
	if !in.Namespaced && c.BindAddress == "" {
		return in.Ports
	}
	out := make(map[string]Port, len(in.Ports))
	for label, p := range in.Ports {
		if in.Namespaced {
			p = Port{HostIP: NamespaceBindAddress, Value: p.inside()}
		}
		if label == c.Port && c.BindAddress != "" {
			p.HostIP = c.BindAddress
		}
		out[label] = p
	}
	return out
}

// connectHost is the address the driver dials for health checks.
func connectHost(host string) string {
	if host == "" || host == "0.0.0.0" || host == "::" {
		return "127.0.0.1"
	}
	return host
}

// checkRuntime checks what needs the allocation: port labels and GPUs.
func checkRuntime(c config.TaskConfig, in Input) error {
	var errs []error
	labels := func() string {
		var l []string
		for k := range in.Ports {
			l = append(l, k)
		}
		if len(l) == 0 {
			return "none (the group has no network ports)"
		}
		slices.Sort(l)
		return strings.Join(l, ", ")
	}
	for _, f := range []struct{ field, label string }{
		{"port", c.Port},
		{"kv_events_port", c.KVEventsPort},
		{"kv_events_replay_port", c.KVEventsReplayPort},
		{"nixl_side_channel_port", c.NIXLSideChannelPort},
		{"bootstrap_port", c.BootstrapPort},
	} {
		if f.label == "" {
			continue
		}
		if _, ok := in.Ports[f.label]; !ok {
			errs = append(errs, &config.FieldError{Field: f.field,
				Msg: fmt.Sprintf("port label %q is not in the group's network block; labels: %s", f.label, labels())})
		}
	}
	if in.Namespaced {
		errs = append(errs, checkNamespaced(c)...)
	}
	if config.IsGPUEngine(c.Engine) && c.TensorParallelSize > len(in.GPUs) {
		errs = append(errs, &config.FieldError{Field: "tensor_parallel_size",
			Msg: fmt.Sprintf("%d is larger than the %d GPU(s) reserved for the task (NVIDIA_VISIBLE_DEVICES=%q); reserve them with a device \"nvidia/gpu\" { count = %d } block",
				c.TensorParallelSize, len(in.GPUs), strings.Join(in.GPUs, ","), c.TensorParallelSize)})
	}
	return errors.Join(errs...)
}

// checkNamespaced refuses what cannot work from inside a group network
// namespace: peers of a disaggregated pair are told the engine's own
// address and port, which are not reachable from outside the namespace, and
// a loopback kvcached address would name the namespace, not the node.
func checkNamespaced(c config.TaskConfig) []error {
	var errs []error
	if c.Disaggregated() {
		errs = append(errs, &config.FieldError{Field: "role", Msg: fmt.Sprintf(
			"role %q advertises the engine's own address and port to its peer, which bridge networking hides behind a mapped port; run disaggregated engines with network mode \"host\"", c.Role)})
	}
	if c.KVOffload == config.OffloadKVCached {
		if h, _, err := net.SplitHostPort(c.KVCachedAddress); err == nil && (h == "localhost" || net.ParseIP(h).IsLoopback()) {
			errs = append(errs, &config.FieldError{Field: "kvcached_address", Msg: fmt.Sprintf(
				"%q is loopback, which inside bridge networking is the allocation's own namespace, not the node's kvcached; set a node address", c.KVCachedAddress)})
		}
	}
	return errs
}

// renderedFlags are the flags the driver owns per engine; extra_args may not repeat them.
// vLLM's and SGLang's --config reads flags from a YAML file, owned ones included.
var renderedFlags = map[string][]string{
	config.EngineVLLM: {"--host", "--port", "--served-model-name", "--tensor-parallel-size", "-tp", "--max-model-len",
		"--gpu-memory-utilization", "--block-size", "--kv-transfer-config", "--kv-events-config",
		"--kv-offloading-backend", "--kv-offloading-size", "--prefix-caching-hash-algo", "--otlp-traces-endpoint",
		"--config"},
	config.EngineSGLang: {"--model-path", "--model", "--host", "--port", "--served-model-name", "--tp-size", "--tp",
		"--context-length", "--mem-fraction-static", "--page-size", "--kv-events-config",
		"--enable-hierarchical-cache", "--hicache-size", "--hicache-write-policy", "--enable-lmcache",
		"--disaggregation-mode", "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port",
		"--hicache-storage-backend", "--config"},
	config.EngineLlamaCpp: {"-m", "--model", "--host", "--port", "-a", "--alias", "-c", "--ctx-size", "-ngl", "--n-gpu-layers", "--gpu-layers"},
	config.EngineTRTLLM: {"--host", "--port", "--tp_size", "--tp", "--max_seq_len", "--kv_cache_free_gpu_memory_fraction",
		"--kv_cache_free_gpu_mem_fraction", "--backend", "--extra_llm_api_options"},
}

// flagFields names the task field each owned flag is rendered from, so that
// a refusal of an extra_args flag points to a field that exists.
var flagFields = map[string]string{
	"--host": "port / bind_address", "--port": "port", "--served-model-name": "served_model_name",
	"-a": "served_model_name", "--alias": "served_model_name",
	"--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size", "--tp-size": "tensor_parallel_size",
	"--tp": "tensor_parallel_size", "--tp_size": "tensor_parallel_size",
	"--max-model-len": "max_model_len", "--context-length": "max_model_len", "-c": "max_model_len",
	"--ctx-size": "max_model_len", "--max_seq_len": "max_model_len",
	"--gpu-memory-utilization": "gpu_memory_utilization", "--mem-fraction-static": "gpu_memory_utilization",
	"--kv_cache_free_gpu_memory_fraction": "gpu_memory_utilization", "--kv_cache_free_gpu_mem_fraction": "gpu_memory_utilization",
	"--block-size": "block_size", "--page-size": "block_size",
	"--kv-transfer-config": "kv_offload and role", "--kv-events-config": "kv_events, kv_events_port and kv_events_replay_port",
	"--kv-offloading-backend": "kv_offload", "--kv-offloading-size": "kv_offload_size_gb",
	"--prefix-caching-hash-algo": "kv_offload (lmcache, kvcached)", "--otlp-traces-endpoint": "otlp_traces_endpoint",
	"--model-path": "model", "--model": "model", "-m": "model",
	"--enable-hierarchical-cache": "kv_offload = \"hicache\"", "--hicache-size": "kv_offload_size_gb",
	"--hicache-write-policy": "kv_offload = \"hicache\"", "--hicache-storage-backend": "hicache_storage_backend",
	"--enable-lmcache": "kv_offload (lmcache, kvcached)", "--disaggregation-mode": "role",
	"--disaggregation-transfer-backend": "disaggregation_transfer_backend", "--disaggregation-bootstrap-port": "bootstrap_port",
	"-ngl": "the GPUs reserved by the task's device block", "--n-gpu-layers": "the GPUs reserved by the task's device block",
	"--gpu-layers":            "the GPUs reserved by the task's device block",
	"--backend":               "nothing: the driver runs the pytorch backend",
	"--extra_llm_api_options": "llm_api_options (and kv_offload = \"native\")",
	"--config":                "the task's fields: a config file would set the flags the driver renders",
}

// argparseEngines parse their command line with Python's argparse, which
// (allow_abbrev on) takes any unambiguous prefix of a long flag for the flag,
// and whose parsers (vLLM's FlexibleArgumentParser, SGLang's) accept '_' for
// '-' in flag names. llama.cpp's own parser and trtllm-serve's (Click) match
// flag names exactly.
var argparseEngines = map[string]bool{config.EngineVLLM: true, config.EngineSGLang: true}

// ownedFlag returns the owned flag an extra_args element sets, or "" when
// it sets none. For argparse engines the name is normalized ('_' → '-')
// and a prefix of an owned flag counts as that flag: argparse resolves it
// to the owned flag when no other flag shares the prefix, and refusing an
// ambiguous prefix refuses nothing the engine would accept.
func ownedFlag(engine, arg string, owned []string) string {
	name, _, _ := strings.Cut(arg, "=")
	if !strings.HasPrefix(name, "-") {
		return ""
	}
	if !argparseEngines[engine] {
		if slices.Contains(owned, name) {
			return name
		}
		return ""
	}
	dashes := "-"
	if strings.HasPrefix(name, "--") {
		dashes = "--"
	}
	name = dashes + strings.ReplaceAll(strings.TrimPrefix(name, dashes), "_", "-")
	if len(name) <= len(dashes) {
		return "" // "-" or "--" alone
	}
	for _, f := range owned {
		if name == f {
			return f
		}
	}
	for _, f := range owned {
		// Same dash style: argparse abbreviates long flags by their prefix.
		if strings.HasPrefix(f, dashes) && (dashes == "--") == strings.HasPrefix(f, "--") && strings.HasPrefix(f, name) {
			return f
		}
	}
	return ""
}

func checkExtraArgs(c config.TaskConfig) error {
	family := c.Engine
	if family == config.EngineSim {
		family = config.EngineVLLM // sim renders exactly like vLLM
	}
	owned := renderedFlags[family]
	for _, a := range c.ExtraArgs {
		f := ownedFlag(family, a, owned)
		if f == "" {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		what := fmt.Sprintf("%q", name)
		if name != f {
			what = fmt.Sprintf("%q (the engine reads it as %s)", name, f)
		}
		return &config.FieldError{Field: "extra_args", Msg: fmt.Sprintf(
			"%s is rendered by the driver from the task config; set %s instead (owned flags for %s: %s)",
			what, flagFields[f], c.Engine, strings.Join(owned, " "))}
	}
	return nil
}

func itoa(i int) string { return strconv.Itoa(i) }

func ftoa(f config.Float) string { return strconv.FormatFloat(float64(f), 'f', -1, 64) }

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("render: marshalling a fixed struct: %v", err)) // static types only
	}
	return string(b)
}

func localFile(in Input, name string, content string) File {
	return File{Path: filepath.Join(in.LocalDir, name), Content: []byte(content)}
}

func isPython(bin string) bool { return strings.HasPrefix(path.Base(bin), "python") }
