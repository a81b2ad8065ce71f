package config

import (
	"testing"

	"github.com/shoenig/test/must"
)

// TestParseTier: every problem of a declaration names the tier, its Nomad
// variable and the item.
func TestParseTier(t *testing.T) {
	cases := []struct {
		name  string
		tier  string
		items map[string]string
		want  string // "" = valid
	}{
		{"kvcached", "node-kv", map[string]string{"kind": "kvcached", "address": "${node.ip}:6380", "secret_path": "nomad/jobs/oasis-kvcached/kvcached", "secret_item": "redis_password"}, ""},
		{"kvcached without auth", "open", map[string]string{"kind": "kvcached", "address": "127.0.0.1:6380", "auth": "none"}, ""},
		{"kvcached needs a password", "kv", map[string]string{"kind": "kvcached", "address": "127.0.0.1:6380"},
			`tier "kv" (Nomad variable oasis/tiers/kv) item secret_path: a kvcached tier needs its password by reference`},
		{"auth none and secret", "kv", map[string]string{"kind": "kvcached", "address": "127.0.0.1:6380", "auth": "none", "secret_path": "a/b"}, `item auth: "none" while secret_path`},
		{"auth other", "kv", map[string]string{"kind": "kvcached", "address": "127.0.0.1:6380", "auth": "off"}, `item auth: "off": the only value is "none"`},
		{"unknown kind", "kv", map[string]string{"kind": "redis"}, `item kind: "redis" is not a tier kind; allowed: kvcached, lmcache-server, mooncake, nixl, hicache-storage, shared-fs`},
		{"unknown item", "kv", map[string]string{"kind": "kvcached", "adress": "x"}, "item adress: unknown item"},
		{"multi-line item", "kv", map[string]string{"kind": "kvcached\nx"}, "item kind: must be one line"},
		{"bad name", "KV", map[string]string{"kind": "shared-fs", "path": "/mnt/kv"}, "the name must be"},
		{"address missing", "lm", map[string]string{"kind": "lmcache-server"}, "item address: is required for kind lmcache-server"},
		{"address not host:port", "lm", map[string]string{"kind": "lmcache-server", "address": "lm://h:1"}, `item address: "lm://h:1" is not host:port`},
		{"address port range", "lm", map[string]string{"kind": "lmcache-server", "address": "h:70000"}, "is not host:port"},
		{"address on shared-fs", "fs", map[string]string{"kind": "shared-fs", "path": "/mnt/kv", "address": "h:1"}, "item address: not used by kind shared-fs"},
		{"shared-fs relative path", "fs", map[string]string{"kind": "shared-fs", "path": "mnt/kv"}, "item path: kind shared-fs needs the shared directory as a clean absolute path"},
		{"shared-fs unclean path", "fs", map[string]string{"kind": "shared-fs", "path": "/mnt/../etc"}, "clean absolute path"},
		{"hicache backend", "l3", map[string]string{"kind": "hicache-storage", "backend": "dynamic"}, "item backend: kind hicache-storage needs SGLang's storage backend"},
		{"size", "fs", map[string]string{"kind": "shared-fs", "path": "/mnt/kv", "size_gb": "-1"}, `item size_gb: "-1" is not a size`},
		{"secret on lmcache-server", "lm", map[string]string{"kind": "lmcache-server", "address": "h:1", "secret_path": "a/b"}, "item secret_path: kind lmcache-server takes no password"},
		{"secret path traversal", "kv", map[string]string{"kind": "kvcached", "address": "h:1", "secret_path": "a/../b"}, `item secret_path: "a/../b" is not a Nomad variable path`},
		{"mooncake", "mc", map[string]string{"kind": "mooncake", "address": "${node.ip}:50051", "protocol": "tcp", "metadata_server": "etcd://10.0.0.2:2379"}, ""},
		{"mooncake protocol", "mc", map[string]string{"kind": "mooncake", "address": "h:50051", "protocol": "udp"}, `item protocol: "udp" is not a Mooncake protocol; allowed: tcp, rdma`},
		{"protocol on kvcached", "kv", map[string]string{"kind": "kvcached", "address": "h:1", "auth": "none", "protocol": "tcp"}, "item protocol: protocol and metadata_server are only used by kind mooncake"},
		{"secret item without path", "kv", map[string]string{"kind": "kvcached", "address": "h:1", "auth": "none", "secret_item": "x"}, "item secret_item: set without secret_path"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tier, err := ParseTier(tc.tier, tc.items)
			if tc.want == "" {
				must.NoError(t, err)
				must.EqOp(t, tc.tier, tier.Name)
				return
			}
			must.ErrorContains(t, err, "kv_offload_tier: ")
			must.ErrorContains(t, err, tc.want)
		})
	}
}

func TestTierNodeAddressAndSecret(t *testing.T) {
	tier, err := ParseTier("kv", map[string]string{"kind": "kvcached", "address": "${node.ip}:6380", "secret_path": "s/kv"})
	must.NoError(t, err)
	must.EqOp(t, "10.0.0.7:6380", tier.NodeAddress("10.0.0.7"))
	must.EqOp(t, "[fd00::7]:6380", tier.NodeAddress("fd00::7"))
	must.EqOp(t, DefaultSecretItem, tier.SecretItem)
	must.ErrorContains(t, tier.CheckSecret("", true), `Nomad variable s/kv has no item "password"`)
	must.ErrorContains(t, tier.CheckSecret("a\nb", true), "must be one line")
	must.NoError(t, tier.CheckSecret("pw", true))
}

// TestWithTierPerEngine: one declaration renders the offload each engine
// reads it with, or is refused naming the item and why.
func TestWithTierPerEngine(t *testing.T) {
	decl := map[string]map[string]string{
		"nfs":    {"kind": "shared-fs", "path": "/mnt/kv", "size_gb": "8"},
		"nfs0":   {"kind": "shared-fs", "path": "/mnt/kv"},
		"mc":     {"kind": "mooncake", "address": "${node.ip}:50051", "size_gb": "4"},
		"mc0":    {"kind": "mooncake", "address": "${node.ip}:50051"},
		"nx":     {"kind": "nixl", "address": "10.0.0.9:5555"},
		"l3-hf3": {"kind": "hicache-storage", "backend": "hf3fs"},
	}
	cases := []struct {
		engine, role, tier    string
		offload, backend, err string
	}{
		{EngineVLLM, RoleBoth, "nfs", OffloadNative, "", ""},
		{EngineSim, RolePrefill, "nfs", OffloadNative, "", ""},
		{EngineSGLang, RoleBoth, "nfs", OffloadHiCache, "file", ""},
		{EngineVLLM, RoleBoth, "mc", OffloadLMCache, "", ""},
		{EngineVLLM, RoleDecode, "mc", OffloadLMCache, "", ""},
		{EngineSGLang, RolePrefill, "mc", OffloadHiCache, "mooncake", ""},
		{EngineSGLang, RoleBoth, "l3-hf3", OffloadHiCache, "hf3fs", ""},
		{EngineVLLM, RoleBoth, "nfs0", "", "", "item size_gb: kind shared-fs with engine vllm needs the CPU staging buffer"},
		{EngineSim, RoleBoth, "mc0", "", "", "item size_gb: kind mooncake with engine sim needs LMCache's CPU tier"},
		{EngineSGLang, RoleBoth, "nfs0", OffloadHiCache, "file", ""},
		{EngineVLLM, RoleBoth, "l3-hf3", "", "", `renders kv_offload = "hicache": kv_offload: "hicache" is not supported by engine vllm`},
		{EngineLlamaCpp, RoleBoth, "nfs", "", "", `renders kv_offload = "hicache": kv_offload: "hicache" is not supported by engine llama_cpp`},
		{EngineVLLM, RoleBoth, "nx", "", "", "item kind: kind nixl is declared but not rendered by this driver"},
	}
	for _, tc := range cases {
		t.Run(tc.engine+"-"+tc.role+"-"+tc.tier, func(t *testing.T) {
			tier, err := ParseTier(tc.tier, decl[tc.tier])
			must.NoError(t, err)
			c := TaskConfig{Engine: tc.engine, Role: tc.role, KVOffloadTier: tc.tier}
			got, err := c.WithTier(tier, "10.0.0.5")
			if tc.err != "" {
				must.ErrorContains(t, err, tc.err)
				return
			}
			must.NoError(t, err)
			must.EqOp(t, tc.offload, got.KVOffload)
			must.EqOp(t, tc.backend, got.HiCacheStorageBackend)
			must.EqOp(t, "", got.KVOffloadTier)
		})
	}
}
