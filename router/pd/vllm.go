package pd

import (
	"encoding/json"
	"errors"

	"github.com/oasis-llm/oasis/router/openai"
)

// The vLLM protocol, as vLLM's own proxy runs it
// (vllm-project/vllm tests/v1/kv_connector/nixl_integration/toy_proxy_server.py,
// examples/online_serving/disaggregated_serving/): the prefill leg is the
// client's body with max_tokens 1 (max_completion_tokens too when set),
// stream false, no stream_options and no min_tokens or
// min_completion_tokens (not supported on the prefill side), and kv_transfer_params asking the prefill
// engine to keep the KV for a remote decode; the engine answers with
// kv_transfer_params naming where the KV is, which the decode leg (the
// client's body otherwise) carries unchanged. Both legs carry the client's
// X-Request-Id.

// prefillParams is the prefill leg's kv_transfer_params.
var prefillParams = json.RawMessage(`{"do_remote_decode":true,"do_remote_prefill":false,` +
	`"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`)

var (
	jsonOne   = json.RawMessage(`1`)
	jsonFalse = json.RawMessage(`false`)
)

// ErrNoKVParams is a prefill answer without kv_transfer_params: the engine
// has no KV connector, or did not keep the KV.
var ErrNoKVParams = errors.New("the prefill answer has no kv_transfer_params")

// VLLMPrefillBody is the prefill leg's body for the client's body.
func VLLMPrefillBody(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	m["max_tokens"] = jsonOne
	if _, ok := m["max_completion_tokens"]; ok {
		m["max_completion_tokens"] = jsonOne
	}
	m["stream"] = jsonFalse
	delete(m, "stream_options")
	delete(m, "min_tokens")
	delete(m, "min_completion_tokens")
	m["kv_transfer_params"] = prefillParams
	return json.Marshal(m)
}

// VLLMKVParams returns the kv_transfer_params of a prefill leg's answer
// (ErrNoKVParams when it has none).
func VLLMKVParams(answer []byte) (json.RawMessage, error) {
	var ans struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &ans); err != nil || len(ans.KV) == 0 || string(ans.KV) == "null" {
		return nil, ErrNoKVParams
	}
	return ans.KV, nil
}

// VLLMDecodeBody is the decode leg's body: the client's, with the prefill
// answer's kv_transfer_params.
func VLLMDecodeBody(body []byte, kv json.RawMessage) ([]byte, error) {
	return openai.WithFields(body, map[string]json.RawMessage{"kv_transfer_params": kv})
}
