package gateway

import (
	"encoding/json"
	"errors"
	"io"
	"time"

	"github.com/oasis-llm/oasis/router/scoring"
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

// errNoKVParams is a prefill answer without kv_transfer_params: the engine
// has no KV connector, or did not keep the KV.
var errNoKVParams = errors.New("the prefill answer has no kv_transfer_params")

// vllmPrefillBody is the prefill leg's body.
func vllmPrefillBody(body []byte) ([]byte, error) {
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

// vllmPair runs the prefill leg on pair.Prefill, then the decode leg on
// pair.Decode, relayed to the client.
func (g *Gateway) vllmPair(c *call, pair scoring.Pair, mayRetry bool) error {
	kv, err := g.vllmPrefill(c, pair.Prefill)
	if err != nil {
		return err
	}
	body, err := withFields(c.x.body, map[string]json.RawMessage{"kv_transfer_params": kv})
	if err != nil {
		return err
	}
	c.rec.worker = pair.Decode.ID
	return g.forward(c.with(c.x.leg(body)), pair.Decode, mayRetry)
}

// vllmPrefill runs a prefill leg and returns its answer's kv_transfer_params.
func (g *Gateway) vllmPrefill(c *call, pw *scoring.Worker) (json.RawMessage, error) {
	x := c.x
	body, err := vllmPrefillBody(x.body)
	if err != nil {
		return nil, err
	}
	call, err := g.startPrefill(c.ctx, c.r, x.leg(body), pw)
	if err != nil {
		return nil, err
	}
	defer call.end()
	defer call.resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(call.resp.Body, maxLegAnswer))
	if err != nil {
		return nil, &prefillLegError{&upstreamError{err: err}}
	}
	took := time.Since(call.sent)
	var ans struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(data, &ans); err != nil || len(ans.KV) == 0 || string(ans.KV) == "null" {
		return nil, &prefillLegError{&upstreamError{err: errNoKVParams}}
	}
	// The answer came with the prompt's first token: a time-to-first-token
	// sample for the prefill worker's learned rate.
	call.pre.FirstToken(took)
	g.m.PrefillLeg.WithLabelValues(x.req.Model).Observe(took.Seconds())
	return ans.KV, nil
}
