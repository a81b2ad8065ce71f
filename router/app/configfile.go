package app

import "github.com/oasis-llm/oasis/internal/agentconfig"

// ConfigKeys are the keys of the router's config file (-config FILE|DIR,
// HCL or JSON), each with the flag it sets: a key means what its flag
// means, with the flag's default. router/README.md "Configuration" is the
// reference; router/app/testdata/router.hcl an example with every key.
var ConfigKeys = []agentconfig.Key{
	{Block: "", Name: "log_level", Flag: "log-level", Kind: agentconfig.String},
	{Block: "", Name: "log_json", Flag: "log-json", Kind: agentconfig.Bool},
	{Block: "", Name: "shutdown_timeout", Flag: "shutdown-timeout", Kind: agentconfig.Duration},

	{Block: "listeners", Name: "api", Flag: "listen", Kind: agentconfig.String},
	{Block: "listeners", Name: "advertise", Flag: "advertise", Kind: agentconfig.String},
	{Block: "listeners", Name: "register", Flag: "register", Kind: agentconfig.Bool},
	{Block: "listeners", Name: "pprof", Flag: "pprof-listen", Kind: agentconfig.String},

	{Block: "tls", Name: "cert", Flag: "tls-cert", Kind: agentconfig.String},
	{Block: "tls", Name: "key", Flag: "tls-key", Kind: agentconfig.String},
	{Block: "tls", Name: "client_ca", Flag: "tls-client-ca", Kind: agentconfig.String},

	{Block: "discovery", Name: "source", Flag: "discovery", Kind: agentconfig.String},
	{Block: "discovery", Name: "consul_addr", Flag: "consul-addr", Kind: agentconfig.String},
	{Block: "discovery", Name: "nomad_addr", Flag: "nomad-addr", Kind: agentconfig.String},
	{Block: "discovery", Name: "service", Flag: "service", Kind: agentconfig.String},
	{Block: "discovery", Name: "service_tag", Flag: "service-tag", Kind: agentconfig.String},
	{Block: "discovery", Name: "engines", Flag: "engines", Kind: agentconfig.List},
	{Block: "discovery", Name: "kvcached_service", Flag: "kvcached-service", Kind: agentconfig.String},
	{Block: "discovery", Name: "hosted_upstreams", Flag: "hosted-upstreams", Kind: agentconfig.List},
	{Block: "discovery", Name: "hosted_key_envs", Flag: "hosted-key-envs", Kind: agentconfig.List},

	{Block: "cors", Name: "origins", Flag: "cors-origins", Kind: agentconfig.List},
	{Block: "cors", Name: "methods", Flag: "cors-methods", Kind: agentconfig.List},
	{Block: "cors", Name: "headers", Flag: "cors-headers", Kind: agentconfig.List},

	{Block: "policy", Name: "kv_prefix", Flag: "kv-prefix", Kind: agentconfig.String},
	{Block: "policy", Name: "file", Flag: "policy-file", Kind: agentconfig.String},
	{Block: "policy", Name: "api_keys_file", Flag: "api-keys-file", Kind: agentconfig.String},
	{Block: "policy", Name: "api_keys_kv", Flag: "api-keys-kv", Kind: agentconfig.Bool},
	{Block: "policy", Name: "response_id_key_file", Flag: "response-id-key-file", Kind: agentconfig.String},

	{Block: "federation", Name: "listen", Flag: "federation-listen", Kind: agentconfig.String},
	{Block: "federation", Name: "advertise", Flag: "federation-advertise", Kind: agentconfig.String},
	{Block: "federation", Name: "datacenter", Flag: "federation-dc", Kind: agentconfig.String},
	{Block: "federation", Name: "tls_cert", Flag: "federation-tls-cert", Kind: agentconfig.String},
	{Block: "federation", Name: "tls_key", Flag: "federation-tls-key", Kind: agentconfig.String},
	{Block: "federation", Name: "tls_ca", Flag: "federation-tls-ca", Kind: agentconfig.String},

	{Block: "peers", Name: "listen", Flag: "peers-listen", Kind: agentconfig.String},
	{Block: "peers", Name: "advertise", Flag: "peers-advertise", Kind: agentconfig.String},
	{Block: "peers", Name: "key_file", Flag: "peers-key-file", Kind: agentconfig.String},
	{Block: "peers", Name: "interval", Flag: "peers-interval", Kind: agentconfig.Duration},
	{Block: "peers", Name: "min_interval", Flag: "peers-min-interval", Kind: agentconfig.Duration},
	{Block: "peers", Name: "node", Flag: "peers-node", Kind: agentconfig.String},

	{Block: "mesh", Name: "service", Flag: "mesh-service", Kind: agentconfig.String},
	{Block: "mesh", Name: "listen", Flag: "mesh-listen", Kind: agentconfig.String},
	{Block: "mesh", Name: "engines", Flag: "mesh-engines", Kind: agentconfig.Bool},

	{Block: "limits", Name: "max_body_bytes", Flag: "max-body-bytes", Kind: agentconfig.Bytes},
	{Block: "limits", Name: "max_header_bytes", Flag: "max-header-bytes", Kind: agentconfig.Bytes},
	{Block: "limits", Name: "body_read_timeout", Flag: "body-read-timeout", Kind: agentconfig.Duration},
	{Block: "limits", Name: "max_connections", Flag: "max-connections", Kind: agentconfig.Int},
	{Block: "limits", Name: "max_connections_per_source", Flag: "max-connections-per-source", Kind: agentconfig.Int},
	{Block: "limits", Name: "eject_after", Flag: "eject-after", Kind: agentconfig.Int},
	{Block: "limits", Name: "max_loaded_adapters", Flag: "max-loaded-adapters", Kind: agentconfig.Int},
	{Block: "limits", Name: "eject_for", Flag: "eject-for", Kind: agentconfig.Duration},
	{Block: "limits", Name: "index_max_blocks", Flag: "index-max-blocks", Kind: agentconfig.Int},
	{Block: "limits", Name: "index_worker_max_blocks", Flag: "index-worker-max-blocks", Kind: agentconfig.Int},
	{Block: "limits", Name: "kvcached_max_blocks", Flag: "kvcached-max-blocks", Kind: agentconfig.Int},

	{Block: "telemetry.metrics", Name: "scrape_interval", Flag: "scrape-interval", Kind: agentconfig.Duration},
	{Block: "telemetry.metrics", Name: "power_from_nomad", Flag: "power-from-nomad", Kind: agentconfig.Bool},
	{Block: "telemetry.tracing", Name: "otlp_endpoint", Flag: "otlp-endpoint", Kind: agentconfig.String},
	{Block: "telemetry.tracing", Name: "sample_ratio", Flag: "trace-sample-ratio", Kind: agentconfig.Float},

	{Block: "runtime", Name: "gc_percent", Flag: "gc-percent", Kind: agentconfig.Int},
	{Block: "runtime", Name: "gomaxprocs", Flag: "gomaxprocs", Kind: agentconfig.Int},
	{Block: "runtime", Name: "memory_limit", Flag: "memory-limit", Kind: agentconfig.Bytes},
}

// DefaultTraceSampleRatio is -trace-sample-ratio's default: 5% of new
// traces, inside the 1–10% BENCHMARKS.md recommends for production (every
// request sampled costs ~30–50 µs of router CPU and 14 KiB). Tests and
// debugging sessions that need every request set 1.
const DefaultTraceSampleRatio = 0.05
