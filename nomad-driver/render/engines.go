package render

import (
	"fmt"
	"maps"
	"math"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// connector is one vLLM --kv-transfer-config connector.
type connector struct {
	KVConnector            string         `json:"kv_connector"`
	KVRole                 string         `json:"kv_role"`
	KVConnectorModulePath  string         `json:"kv_connector_module_path,omitempty"`
	KVConnectorExtraConfig map[string]any `json:"kv_connector_extra_config,omitempty"`
}

// kvEventsConfig is --kv-events-config. vLLM needs enable_kv_cache_events;
// SGLang has no such field (a publisher turns events on).
type kvEventsConfig struct {
	EnableKVCacheEvents *bool  `json:"enable_kv_cache_events,omitempty"`
	Publisher           string `json:"publisher"`
	Endpoint            string `json:"endpoint"`
	// ReplayEndpoint binds the ROUTER socket that re-sends buffered batches
	// from a sequence number (vLLM and SGLang: replay_endpoint).
	ReplayEndpoint string `json:"replay_endpoint,omitempty"`
	Topic          string `json:"topic"`
}

// eventsConfig renders --kv-events-config; enable is vLLM's
// enable_kv_cache_events (nil for SGLang).
func eventsConfig(c config.TaskConfig, in Input, enable *bool) string {
	ec := kvEventsConfig{EnableKVCacheEvents: enable, Publisher: "zmq",
		Endpoint: bindEndpoint(in.Ports[c.KVEventsPort]), Topic: KVEventsTopic}
	if c.KVEventsReplayPort != "" {
		ec.ReplayEndpoint = bindEndpoint(in.Ports[c.KVEventsReplayPort])
	}
	return mustJSON(ec)
}

// KVEventsTopic is the ZMQ topic engines publish KV events on.
const KVEventsTopic = "kv-events"

const gib = 1 << 30

func bindEndpoint(p Port) string {
	host := p.HostIP
	if host == "" {
		host = "*"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return fmt.Sprintf("tcp://%s:%d", host, p.Value)
}

func renderVLLM(p *Plan, c config.TaskConfig, in Input, bin, host string, port int) error {
	a := []string{bin, "serve", c.Model}
	if host != "" {
		a = append(a, "--host", host)
	}
	a = append(a, "--port", itoa(port), "--served-model-name", c.ServedModelName)
	a = append(a, c.ServedModelNames...)
	if len(c.LoRAModules) > 0 || len(c.LoRALoadable) > 0 {
		a = append(a, "--enable-lora")
	}
	if len(c.LoRAModules) > 0 {
		a = append(a, "--lora-modules")
		a = append(a, c.LoRAModules...)
	}
	if len(c.LoRALoadable) > 0 {
		// The router loads them through /v1/load_lora_adapter, which vLLM
		// serves only with this set.
		p.Env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
	}
	a = append(a, "--tensor-parallel-size", itoa(c.TensorParallelSize))
	if c.MaxModelLen > 0 {
		a = append(a, "--max-model-len", itoa(c.MaxModelLen))
	}
	if c.GPUMemoryUtilization > 0 {
		a = append(a, "--gpu-memory-utilization", ftoa(c.GPUMemoryUtilization))
	}
	a = append(a, "--block-size", itoa(c.BlockSize))

	var conns []connector
	if c.SGLangStyleSim() {
		// oasis-sim speaks SGLang's protocol with SGLang's flags (bootstrap rooms
		// instead of kv_transfer_params); a decode sim accepts and ignores the port.
		a = append(a, "--disaggregation-mode", c.Role, "--disaggregation-transfer-backend", c.DisaggTransferBackend,
			"--disaggregation-bootstrap-port", itoa(in.Ports[c.BootstrapPort].Value))
	} else if c.Disaggregated() {
		// Both halves of a P/D pair run NIXL as kv_both; the proxy's
		// kv_transfer_params decide who sends and who receives.
		conns = append(conns, connector{KVConnector: "NixlConnector", KVRole: "kv_both"})
		side := in.Ports[c.NIXLSideChannelPort]
		p.Env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = connectHost(side.HostIP)
		p.Env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = itoa(side.Value)
	}
	offloadFlags := []string(nil)
	switch c.KVOffload {
	case config.OffloadNative:
		if p.Tier != "" && in.Tier.Kind == config.TierSharedFS {
			conns = append(conns, sharedStorageConnector(p, c, in.Tier))
			offloadFlags = append(offloadFlags, "--prefix-caching-hash-algo", lmcacheHashAlgo)
		} else if c.Disaggregated() {
			// --kv-offloading-* would replace the NIXL connector: stack instead.
			conns = append(conns, connector{KVConnector: "OffloadingConnector", KVRole: "kv_both",
				KVConnectorExtraConfig: map[string]any{"cpu_bytes_to_use": int64(c.KVOffloadSizeGB * gib)}})
		} else {
			offloadFlags = []string{"--kv-offloading-backend", "native", "--kv-offloading-size", ftoa(c.KVOffloadSizeGB)}
		}
	case config.OffloadLMCache, config.OffloadKVCached:
		conns = append(conns, connector{KVConnector: "LMCacheConnectorV1", KVRole: "kv_both"})
		// LMCache hashes chunks with vLLM's own hash function and seed: one
		// chunk per vLLM block, the same algorithm on both sides and a fixed
		// PYTHONHASHSEED make LMCache's chunk hash equal vLLM's block hash, so
		// the router can map kvcached's presence events to its digests.
		writeLMCacheConfig(p, c, in, c.BlockSize)
		offloadFlags = append(offloadFlags, "--prefix-caching-hash-algo", lmcacheHashAlgo)
		if _, set := c.ExtraEnv["PYTHONHASHSEED"]; !set {
			p.Env["PYTHONHASHSEED"] = "0"
		}
	case config.OffloadKVBM:
		conns = append(conns, connector{KVConnector: "DynamoConnector", KVRole: "kv_both",
			KVConnectorModulePath: "kvbm.vllm_integration.connector"})
		p.Env["DYN_KVBM_CPU_CACHE_GB"] = ftoa(c.KVOffloadSizeGB)
	case config.OffloadFlexKV:
		// vLLM's FlexKVConnectorV1 reads FlexKV's settings from FLEXKV_*
		// (extra_env adds the SSD tier's). Engines on one node must not share
		// FlexKV's IPC endpoint (FlexKV hangs at init): each task gets one in
		// its own directory. The CPU tier is whole GiB (FlexKV reads an int).
		conns = append(conns, connector{KVConnector: "FlexKVConnectorV1", KVRole: "kv_both"})
		p.Env["FLEXKV_CPU_CACHE_GB"] = strconv.FormatInt(int64(math.Ceil(float64(c.KVOffloadSizeGB))), 10)
		p.Env["FLEXKV_SERVER_RECV_PORT"] = "ipc://" + filepath.Join(in.LocalDir, "flexkv.ipc")
	}
	switch len(conns) {
	case 0:
	case 1:
		a = append(a, "--kv-transfer-config", mustJSON(conns[0]))
	default:
		a = append(a, "--kv-transfer-config", mustJSON(connector{KVConnector: "MultiConnector", KVRole: "kv_both",
			KVConnectorExtraConfig: map[string]any{"connectors": conns}}))
	}
	a = append(a, offloadFlags...)

	if c.EventsOn() {
		on := true
		a = append(a, "--kv-events-config", eventsConfig(c, in, &on))
	}
	if c.OTLPTracesEndpoint != "" {
		a = append(a, "--otlp-traces-endpoint", otlpTraces(p, c.OTLPTracesEndpoint))
	}
	p.Argv = a
	return nil
}

// llmdFSBlockTokens is the default file size of llm-d's
// SharedStorageOffloadingSpec in tokens (its DEFAULT_STORAGE_BLOCK_SIZE).
const llmdFSBlockTokens = 256

// sharedStorageConnector is vLLM's OffloadingConnector with llm-d's
// SharedStorageOffloadingSpec (the llmd_fs_backend package, which the
// engine's image must have) on a shared-fs tier's directory. Every engine
// names a block by the same hash only with the same seed: PYTHONHASHSEED is
// fixed unless extra_env sets it. A file holds the smallest multiple of the
// engine's block size that is at least 256 tokens (the spec asserts a
// multiple); size_gb is the staging buffer in whole GiB (the spec reads an
// integer).
func sharedStorageConnector(p *Plan, c config.TaskConfig, t *config.Tier) connector {
	if _, set := c.ExtraEnv["PYTHONHASHSEED"]; !set {
		p.Env["PYTHONHASHSEED"] = "0"
	}
	fileTokens := (llmdFSBlockTokens + c.BlockSize - 1) / c.BlockSize * c.BlockSize
	return connector{KVConnector: "OffloadingConnector", KVRole: "kv_both", KVConnectorExtraConfig: map[string]any{
		"spec_name":             "SharedStorageOffloadingSpec",
		"spec_module_path":      "llmd_fs_backend.spec",
		"shared_storage_path":   t.Path,
		"block_size":            fileTokens,
		"max_staging_memory_gb": int64(math.Ceil(t.SizeGB)),
	}}
}

// otlpTraces returns vLLM's --otlp-traces-endpoint for a validated
// otlp_traces_endpoint and sets the OpenTelemetry exporter's protocol:
// OTLP/HTTP takes the whole URL (path default /v1/traces), OTLP/gRPC
// host:port over plain text.
func otlpTraces(p *Plan, endpoint string) string {
	u, _ := url.Parse(endpoint)
	if u.Scheme == "grpc" {
		p.Env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "grpc"
		p.Env["OTEL_EXPORTER_OTLP_TRACES_INSECURE"] = "true"
		return u.Host
	}
	p.Env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
	if u.Path == "" || u.Path == "/" {
		u.Path = "/v1/traces"
	}
	return u.String()
}

func renderSGLang(p *Plan, c config.TaskConfig, in Input, bin, host string, port int) error {
	a := []string{bin}
	if isPython(bin) {
		a = append(a, "-m", "sglang.launch_server")
	}
	a = append(a, "--model-path", c.Model, "--served-model-name", c.ServedModelName)
	if host != "" {
		a = append(a, "--host", host)
	}
	a = append(a, "--port", itoa(port), "--tp-size", itoa(c.TensorParallelSize))
	if c.MaxModelLen > 0 {
		a = append(a, "--context-length", itoa(c.MaxModelLen))
	}
	if c.GPUMemoryUtilization > 0 {
		a = append(a, "--mem-fraction-static", ftoa(c.GPUMemoryUtilization))
	}
	a = append(a, "--page-size", itoa(c.BlockSize), "--enable-metrics")
	switch c.KVOffload {
	case config.OffloadHiCache:
		a = append(a, "--enable-hierarchical-cache", "--hicache-write-policy", "write_through")
		if c.KVOffloadSizeGB > 0 {
			a = append(a, "--hicache-size", ftoa(c.KVOffloadSizeGB))
		}
		if c.HiCacheStorageBackend != "" {
			a = append(a, "--hicache-storage-backend", c.HiCacheStorageBackend)
		}
		if p.Tier != "" {
			tierEnv(p, in)
		}
	case config.OffloadLMCache, config.OffloadKVCached:
		a = append(a, "--enable-lmcache")
		// SGLang's page hashes are not LMCache's chunk hashes: keep LMCache's
		// default chunk.
		writeLMCacheConfig(p, c, in, lmcacheChunkSize)
	}
	if c.Disaggregated() {
		a = append(a, "--disaggregation-mode", c.Role, "--disaggregation-transfer-backend", c.DisaggTransferBackend)
		if c.Role == config.RolePrefill {
			a = append(a, "--disaggregation-bootstrap-port", itoa(in.Ports[c.BootstrapPort].Value))
		}
	}
	if c.EventsOn() {
		a = append(a, "--kv-events-config", eventsConfig(c, in, nil))
	}
	p.Argv = a
	return nil
}

func renderLlamaCpp(p *Plan, c config.TaskConfig, in Input, bin, host string, port int) {
	a := []string{bin, "-m", c.Model}
	if host != "" {
		a = append(a, "--host", host)
	}
	// Always pass --port: llama-server's default moved between releases.
	a = append(a, "--port", itoa(port), "-a", c.ServedModelName)
	if c.MaxModelLen > 0 {
		a = append(a, "-c", itoa(c.MaxModelLen))
	}
	if len(in.GPUs) > 0 {
		a = append(a, "-ngl", "999")
	}
	// Loaded at start (ids 0, 1, ... in this order); the router finds an
	// adapter's id by its path in GET /lora-adapters and names the adapters
	// to apply in every request it sends (router/gateway/llamalora.go).
	for _, s := range c.LoRALoadable {
		m, _ := config.ParseLoRAModule(s)
		a = append(a, "--lora", m.Path)
	}
	p.Argv = append(a, "--metrics")
}

func renderTRTLLM(p *Plan, c config.TaskConfig, in Input, bin, host string, port int) {
	p.MetricsPath = "/prometheus/metrics"
	a := []string{bin, "serve", c.Model}
	if host != "" {
		a = append(a, "--host", host)
	}
	a = append(a, "--port", itoa(port), "--backend", "pytorch", "--tp_size", itoa(c.TensorParallelSize))
	if c.MaxModelLen > 0 {
		a = append(a, "--max_seq_len", itoa(c.MaxModelLen))
	}
	if c.GPUMemoryUtilization > 0 {
		a = append(a, "--kv_cache_free_gpu_memory_fraction", ftoa(c.GPUMemoryUtilization))
	}
	opts := maps.Clone(c.LLMAPIOptions) // Normalize sets enable_iter_perf_stats
	if c.KVOffload == config.OffloadNative {
		opts["kv_cache_config.host_cache_size"] = strconv.FormatInt(int64(c.KVOffloadSizeGB*gib), 10)
		if _, set := opts["kv_cache_config.enable_block_reuse"]; !set {
			opts["kv_cache_config.enable_block_reuse"] = "true"
		}
	}
	f := localFile(in, TRTLLMOptionsName, fmt.Sprintf("# Written by the Oasis llm driver (llm_api_options, kv_offload = %q).\n%s",
		c.KVOffload, optionsYAML(opts)))
	p.Files = append(p.Files, f)
	p.Argv = append(a, "--extra_llm_api_options", f.Path)
}

// optionsYAML writes dotted keys ("a.b") with scalar values as nested YAML
// mappings, keys sorted. Values "true"/"false" and decimal numbers are
// written as such; anything else as a quoted string (a JSON string is a
// YAML string), so a value cannot open a mapping or a document.
func optionsYAML(opts map[string]string) string {
	var b strings.Builder
	var prev []string
	for _, k := range slices.Sorted(maps.Keys(opts)) {
		parts := strings.Split(k, ".")
		common := 0
		for common < len(prev)-1 && common < len(parts)-1 && prev[common] == parts[common] {
			common++
		}
		for i := common; i < len(parts)-1; i++ {
			fmt.Fprintf(&b, "%s%s:\n", strings.Repeat("  ", i), parts[i])
		}
		fmt.Fprintf(&b, "%s%s: %s\n", strings.Repeat("  ", len(parts)-1), parts[len(parts)-1], yamlScalar(opts[k]))
		prev = parts
	}
	return b.String()
}

var yamlNumberRE = regexp.MustCompile(`^-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?$`)

func yamlScalar(v string) string {
	if v == "true" || v == "false" || yamlNumberRE.MatchString(v) {
		return v
	}
	return mustJSON(v)
}

// tierEnv sets the environment a HiCache storage tier reads: the shared
// directory of a shared-fs tier, the Mooncake store of a mooncake tier
// (SGLang's mooncake backend reads MOONCAKE_* and the local hostname peers
// reach it at).
func tierEnv(p *Plan, in Input) {
	t := in.Tier
	switch t.Kind {
	case config.TierSharedFS:
		p.Env["SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR"] = t.Path
	case config.TierMooncake:
		p.Env["MOONCAKE_MASTER"] = t.NodeAddress(in.nodeIP)
		p.Env["MOONCAKE_LOCAL_HOSTNAME"], p.Env["LOCAL_HOSTNAME"] = in.nodeIP, in.nodeIP
		if t.Protocol != "" {
			p.Env["MOONCAKE_PROTOCOL"] = t.Protocol
		}
		if t.MetadataServer != "" {
			p.Env["MOONCAKE_TE_META_DATA_SERVER"] = t.MetadataServer
		}
	}
}

// lmcacheHashAlgo is the prefix hash both vLLM (--prefix-caching-hash-algo)
// and LMCache (pre_caching_hash_algorithm) use: stable across processes and
// hosts with a fixed PYTHONHASHSEED.
const lmcacheHashAlgo = "sha256_cbor"

// writeLMCacheConfig writes LMCache's YAML into the task dir. kvcached is
// LMCache with its remote tier on the node-local oasis-kvcached (Redis
// protocol); a kv_offload_tier adds its remote (with the tier's password,
// in the URL redis-py reads it from, the file then written 0600 into the
// secrets directory). Partial chunks are not saved: the engine never caches
// a partial block either, and their hashes would match nothing.
func writeLMCacheConfig(p *Plan, c config.TaskConfig, in Input, chunk int) {
	var b strings.Builder
	if p.Tier != "" {
		fmt.Fprintf(&b, "# Written by the Oasis llm driver (kv_offload_tier = %q, kind %s).\n", p.Tier, in.Tier.Kind)
	} else {
		fmt.Fprintf(&b, "# Written by the Oasis llm driver (kv_offload = %q).\n", c.KVOffload)
	}
	fmt.Fprintf(&b, "chunk_size: %d\nsave_unfull_chunk: false\n", chunk)
	if c.KVOffloadSizeGB > 0 {
		fmt.Fprintf(&b, "local_cpu: true\nmax_local_cpu_size: %s\n", ftoa(c.KVOffloadSizeGB))
	} else {
		b.WriteString("local_cpu: false\n")
	}
	secret := false
	switch {
	case c.KVOffload == config.OffloadKVCached:
		u := url.URL{Scheme: "redis", Host: c.KVCachedAddress}
		if p.Tier != "" && in.Tier.Secret != "" {
			u.User, secret = url.UserPassword("", in.Tier.Secret), true
		}
		fmt.Fprintf(&b, "remote_url: %s\nremote_serde: naive\n", mustJSON(u.String()))
	case p.Tier != "" && in.Tier.Kind == config.TierLMCacheServer:
		fmt.Fprintf(&b, "remote_url: %s\nremote_serde: naive\n", mustJSON("lm://"+in.Tier.NodeAddress(in.nodeIP)))
	case p.Tier != "" && in.Tier.Kind == config.TierMooncake:
		writeMooncakeRemote(&b, in)
	}
	fmt.Fprintf(&b, "pre_caching_hash_algorithm: %s\n", lmcacheHashAlgo)
	f := localFile(in, LMCacheConfigName, b.String())
	if secret {
		f = File{Path: filepath.Join(in.SecretsDir, LMCacheConfigName), Content: []byte(b.String()), Secret: true}
	}
	p.Files = append(p.Files, f)
	p.Env["LMCACHE_CONFIG_FILE"] = f.Path
}

// writeMooncakeRemote adds a mooncake tier as LMCache's mooncakestore://
// remote. LMCache's Mooncake connector reads the store's settings from
// extra_config: local_hostname, metadata_server and master_server_address
// are required (the URL's host:port overrides the last), protocol defaults
// to tcp. Without a declared metadata server Mooncake's transfer engine
// exchanges its metadata peer to peer (P2PHANDSHAKE).
func writeMooncakeRemote(b *strings.Builder, in Input) {
	t := in.Tier
	master := t.NodeAddress(in.nodeIP)
	meta, proto := t.MetadataServer, t.Protocol
	if meta == "" {
		meta = "P2PHANDSHAKE"
	}
	if proto == "" {
		proto = "tcp"
	}
	fmt.Fprintf(b, "remote_url: %s\nremote_serde: naive\nextra_config:\n", mustJSON("mooncakestore://"+master+"/"))
	fmt.Fprintf(b, "  local_hostname: %s\n  metadata_server: %s\n  protocol: %s\n  master_server_address: %s\n",
		mustJSON(in.nodeIP), mustJSON(meta), mustJSON(proto), mustJSON(master))
}
