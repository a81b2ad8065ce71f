package config

import (
	"slices"
	"strings"
)

// support says which roles an engine accepts with one kv_offload mode, and
// why the mode is refused where it is.
type support struct {
	roles  []string // allowed roles; empty: the offload is refused for the engine
	reason string   // why it is refused (entirely or for the missing roles)
}

var allRoles = []string{RoleBoth, RolePrefill, RoleDecode}
var disaggRoles = []string{RolePrefill, RoleDecode}

// matrix is the single source of truth for engine × kv_offload × role.
var matrix = map[string]map[string]support{
	EngineVLLM: vllmMatrix,
	EngineSim:  vllmMatrix, // sim renders exactly like vLLM
	EngineSGLang: {
		OffloadNone:     {roles: allRoles},
		OffloadNative:   {reason: "native is vLLM's CPU offloading; SGLang's host-memory tier is kv_offload = \"hicache\""},
		OffloadLMCache:  {roles: []string{RoleBoth}, reason: "SGLang's LMCache integration does not combine with --disaggregation-mode"},
		OffloadKVCached: {roles: []string{RoleBoth}, reason: "kvcached goes through SGLang's LMCache integration, which does not combine with --disaggregation-mode"},
		OffloadNIXL:     {roles: disaggRoles, reason: "nixl is the KV transfer backend between a prefill and a decode server; it needs role prefill or decode"},
		OffloadHiCache:  {roles: allRoles},
		OffloadKVBM:     {reason: "KVBM integrates with vLLM (and TensorRT-LLM via Dynamo), not SGLang"},
		OffloadFlexKV:   {reason: "FlexKV reaches SGLang as a HiCache storage backend that needs FlexKV's patch to SGLang, which this driver cannot apply"},
	},
	EngineLlamaCpp: {
		OffloadNone: {roles: []string{RoleBoth}, reason: "llama-server has no prefill/decode disaggregation"},
	},
	EngineTRTLLM: {
		OffloadNone:   {roles: []string{RoleBoth}, reason: "disaggregated TensorRT-LLM needs trtllm-serve disaggregated, which this driver does not render"},
		OffloadNative: {roles: []string{RoleBoth}, reason: "disaggregated TensorRT-LLM needs trtllm-serve disaggregated, which this driver does not render"},
		OffloadFlexKV: {reason: "FlexKV's TensorRT-LLM adaptation is not rendered by this driver; TensorRT-LLM's host tier is kv_offload = \"native\""},
	},
	EngineOpenAICompat: {
		OffloadNone: {roles: []string{RoleBoth}, reason: "a remote OpenAI-compatible endpoint serves whole requests"},
	},
}

var vllmMatrix = map[string]support{
	OffloadNone:     {roles: allRoles},
	OffloadNative:   {roles: allRoles},
	OffloadLMCache:  {roles: allRoles},
	OffloadKVCached: {roles: allRoles},
	OffloadNIXL:     {roles: disaggRoles, reason: "nixl is the KV transfer connector between a prefill and a decode instance; it needs role prefill or decode"},
	OffloadHiCache:  {reason: "hicache is SGLang's hierarchical cache; vLLM offloads with native, lmcache, kvcached, kvbm or flexkv"},
	OffloadKVBM:     {roles: allRoles},
	OffloadFlexKV:   {roles: []string{RoleBoth}, reason: "FlexKV stacks with NIXL for prefill/decode only inside Dynamo's PdConnector, which this driver does not render"},
}

// Supported reports whether the combination renders.
func Supported(engine, offload, role string) bool {
	return slices.Contains(matrix[engine][offload].roles, role)
}

// AllowedOffloads lists the kv_offload values that render for engine and role.
func AllowedOffloads(engine, role string) []string {
	var out []string
	for _, o := range Offloads {
		if Supported(engine, o, role) {
			out = append(out, o)
		}
	}
	return out
}

// CheckCombination explains why an engine × kv_offload × role combination
// does not render, listing what is allowed; nil when it renders.
func CheckCombination(engine, offload, role string) error {
	if Supported(engine, offload, role) {
		return nil
	}
	s := matrix[engine][offload]
	if len(s.roles) == 0 {
		return fieldErr("kv_offload", "%q is not supported by engine %s (%s); allowed for %s with role %s: %s",
			offload, engine, s.reason, engine, role, orNone(AllowedOffloads(engine, role)))
	}
	return fieldErr("role", "%q is not supported by engine %s with kv_offload %q (%s); allowed roles: %s",
		role, engine, offload, s.reason, strings.Join(s.roles, ", "))
}

func orNone(s []string) string {
	if len(s) == 0 {
		return "none (no kv_offload works with this role)"
	}
	return strings.Join(s, ", ")
}
