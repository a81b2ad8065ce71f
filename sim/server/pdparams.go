package server

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Request fields of disaggregated prefill/decode, parsed strictly: they are untrusted
// input, and a malformed value is a 400 that names the field.

// maxRemoteBlocks bounds remote_block_ids (far beyond any context window).
const maxRemoteBlocks = 1 << 20

// vllmKV is a request's kv_transfer_params, the fields vLLM's NixlConnector reads
// (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, update_state_after_alloc
// and request_finished).
type vllmKV struct {
	remoteDecode  bool
	remotePrefill bool
	engineID      string
	requestID     string
	host          string
	port          int
	blockIDs      []int32
}

func kvFieldErr(field, format string, args ...any) error {
	return badRequest("kv_transfer_params."+field, "kv_transfer_params.%s %s", field, fmt.Sprintf(format, args...))
}

// parseKVTransferParams returns nil for an absent or null object.
func parseKVTransferParams(raw json.RawMessage) (*vllmKV, error) {
	if isNull(raw) {
		return nil, nil
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, badRequest("kv_transfer_params", "kv_transfer_params must be an object")
	}
	kv := &vllmKV{}
	var err error
	if kv.remoteDecode, err = optBool(m, "do_remote_decode"); err != nil {
		return nil, err
	}
	if kv.remotePrefill, err = optBool(m, "do_remote_prefill"); err != nil {
		return nil, err
	}
	if kv.remoteDecode && kv.remotePrefill {
		return nil, badRequest("kv_transfer_params", "kv_transfer_params: do_remote_decode and do_remote_prefill are both true")
	}
	if !kv.remotePrefill {
		return kv, nil
	}
	for _, f := range []struct {
		name string
		dst  *string
	}{{"remote_engine_id", &kv.engineID}, {"remote_request_id", &kv.requestID}, {"remote_host", &kv.host}} {
		if err := json.Unmarshal(m[f.name], f.dst); err != nil || *f.dst == "" {
			return nil, kvFieldErr(f.name, "must be a non-empty string when do_remote_prefill is true")
		}
	}
	if err := json.Unmarshal(m["remote_port"], &kv.port); err != nil || kv.port < 1 || kv.port > 65535 {
		return nil, kvFieldErr("remote_port", "must be an integer port (1-65535) when do_remote_prefill is true")
	}
	ids, ok := blockIDList(m["remote_block_ids"])
	if !ok || len(ids) > maxRemoteBlocks {
		return nil, kvFieldErr("remote_block_ids", "must be an array of at most %d block ids (or of one array per KV cache group) when do_remote_prefill is true", maxRemoteBlocks)
	}
	kv.blockIDs = make([]int32, len(ids))
	for i, id := range ids {
		if id < 0 || id > 1<<31-1 {
			return nil, kvFieldErr("remote_block_ids", "has an invalid block id %d", id)
		}
		kv.blockIDs[i] = int32(id)
	}
	return kv, nil
}

// blockIDList reads remote_block_ids: a flat array, or (vLLM with several KV cache
// groups) an array of arrays, flattened.
func blockIDList(raw json.RawMessage) ([]int64, bool) {
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		return ids, ids != nil
	}
	var groups [][]int64
	if err := json.Unmarshal(raw, &groups); err != nil || groups == nil {
		return nil, false
	}
	ids = []int64{}
	for _, g := range groups {
		ids = append(ids, g...)
	}
	return ids, true
}

func optBool(m map[string]json.RawMessage, name string) (bool, error) {
	raw, ok := m[name]
	if !ok || isNull(raw) {
		return false, nil
	}
	var b bool
	if err := json.Unmarshal(raw, &b); err != nil {
		return false, kvFieldErr(name, "must be a boolean")
	}
	return b, nil
}

func isNull(raw json.RawMessage) bool {
	return len(raw) == 0 || strings.TrimSpace(string(raw)) == "null"
}

// sglangBootstrap is SGLang's bootstrap_host / bootstrap_port / bootstrap_room, as
// its load balancer adds them to both legs (python/sglang/srt/disaggregation/mini_lb.py,
// _forward_to_backend; the fields of CompletionRequest and ChatCompletionRequest in
// python/sglang/srt/entrypoints/openai/protocol.py).
type sglangBootstrap struct {
	host string
	port int
	room int64
}

func (b *sglangBootstrap) addr() string {
	return net.JoinHostPort(strings.Trim(b.host, "[]"), strconv.Itoa(b.port))
}

// parseBootstrap returns nil when no bootstrap field is set. A prefill server needs
// only the room; a decode server needs all three.
func parseBootstrap(host, port, room json.RawMessage, decode bool) (*sglangBootstrap, error) {
	if isNull(host) && isNull(port) && isNull(room) {
		return nil, nil
	}
	b := &sglangBootstrap{}
	if err := json.Unmarshal(room, &b.room); err != nil || isNull(room) || b.room < 0 {
		return nil, badRequest("bootstrap_room", "bootstrap_room must be a non-negative integer")
	}
	if !decode {
		return b, nil
	}
	if err := json.Unmarshal(host, &b.host); err != nil || b.host == "" {
		return nil, badRequest("bootstrap_host", "bootstrap_host must be a non-empty string")
	}
	if err := json.Unmarshal(port, &b.port); err != nil || b.port < 1 || b.port > 65535 {
		return nil, badRequest("bootstrap_port", "bootstrap_port must be an integer port (1-65535)")
	}
	return b, nil
}
