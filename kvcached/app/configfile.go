package app

import "github.com/oasis-llm/oasis/internal/agentconfig"

// ConfigKeys are the keys of kvcached's config file (--config FILE|DIR, HCL
// or JSON), each with the flag it sets: a key means what its flag means,
// with the flag's default. kvcached/README.md "Configuration" is the
// reference; kvcached/app/testdata/kvcached.hcl an example with every key.
var ConfigKeys = []agentconfig.Key{
	{Block: "", Name: "log_level", Flag: "log-level", Kind: agentconfig.String},

	{Block: "listeners", Name: "resp", Flag: "addr", Kind: agentconfig.String},
	{Block: "listeners", Name: "http", Flag: "http-addr", Kind: agentconfig.String},
	{Block: "listeners", Name: "quic", Flag: "quic-addr", Kind: agentconfig.String},
	{Block: "listeners", Name: "quic_advertise", Flag: "quic-advertise", Kind: agentconfig.String},

	{Block: "tls", Name: "ca", Flag: "tls-ca", Kind: agentconfig.String},
	{Block: "tls", Name: "cert", Flag: "tls-cert", Kind: agentconfig.String},
	{Block: "tls", Name: "key", Flag: "tls-key", Kind: agentconfig.String},
	{Block: "tls", Name: "server_name", Flag: "tls-server-name", Kind: agentconfig.String},
	{Block: "tls", Name: "verify_address", Flag: "tls-verify-address", Kind: agentconfig.Bool},

	{Block: "tiers.ram", Name: "bytes", Flag: "ram-bytes", Kind: agentconfig.Bytes},
	{Block: "tiers.disk", Name: "bytes", Flag: "disk-bytes", Kind: agentconfig.Bytes},
	{Block: "tiers.disk", Name: "dir", Flag: "data-dir", Kind: agentconfig.String},

	{Block: "peers", Name: "static", Flag: "peers", Kind: agentconfig.List},
	{Block: "peers", Name: "consul_addr", Flag: "consul-addr", Kind: agentconfig.String},
	{Block: "peers", Name: "consul_service", Flag: "consul-service", Kind: agentconfig.String},
	{Block: "peers", Name: "mesh", Flag: "mesh", Kind: agentconfig.Bool},
	{Block: "peers", Name: "timeout", Flag: "peer-timeout", Kind: agentconfig.Duration},
	{Block: "peers", Name: "filter_interval", Flag: "peer-filter-interval", Kind: agentconfig.Duration},
	{Block: "peers", Name: "datacenters", Flag: "peer-datacenters", Kind: agentconfig.List},
	{Block: "peers", Name: "wan_timeout", Flag: "peer-wan-timeout", Kind: agentconfig.Duration},
	{Block: "peers", Name: "wan_bytes_per_second", Flag: "peer-wan-bytes-per-second", Kind: agentconfig.Bytes},
	{Block: "peers", Name: "wan_discovery_timeout", Flag: "peer-wan-discovery-timeout", Kind: agentconfig.Duration},

	{Block: "auth", Name: "password_file", Flag: "password-file", Kind: agentconfig.String},
	{Block: "auth", Name: "timeout", Flag: "auth-timeout", Kind: agentconfig.Duration},

	{Block: "limits", Name: "max_value_bytes", Flag: "max-value-bytes", Kind: agentconfig.Bytes},
	{Block: "limits", Name: "idle_timeout", Flag: "idle-timeout", Kind: agentconfig.Duration},

	{Block: "telemetry", Name: "pprof", Flag: "pprof", Kind: agentconfig.Bool},
	{Block: "telemetry.kv_events", Name: "endpoint", Flag: "kv-events-endpoint", Kind: agentconfig.String},
	{Block: "telemetry.kv_events", Name: "replay_endpoint", Flag: "kv-events-replay-endpoint", Kind: agentconfig.String},
	{Block: "telemetry.kv_events", Name: "block_size", Flag: "kv-events-block-size", Kind: agentconfig.Int},
}
