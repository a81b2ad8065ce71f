package gateway

import (
	"encoding/json"
	"io"
	"time"

	"github.com/oasis-llm/oasis/router/pd"
	"github.com/oasis-llm/oasis/router/scoring"
)

// The vLLM protocol (router/pd/vllm.go): the prefill leg first, then the
// decode leg with its answer's kv_transfer_params.

// vllmPair runs the prefill leg on pair.Prefill, then the decode leg on
// pair.Decode, relayed to the client.
func (g *Gateway) vllmPair(c *call, pair scoring.Pair, mayRetry bool) error {
	kv, err := g.vllmPrefill(c, pair.Prefill)
	if err != nil {
		return err
	}
	body, err := pd.VLLMDecodeBody(c.x.body, kv)
	if err != nil {
		return err
	}
	c.rec.worker = pair.Decode.ID
	return g.forward(c.with(c.x.leg(body)), pair.Decode, mayRetry)
}

// vllmPrefill runs a prefill leg and returns its answer's kv_transfer_params.
func (g *Gateway) vllmPrefill(c *call, pw *scoring.Worker) (json.RawMessage, error) {
	x := c.x
	body, err := pd.VLLMPrefillBody(x.body)
	if err != nil {
		return nil, err
	}
	call, err := g.startPrefill(c.ctx, c.r, x.leg(body), pw)
	if err != nil {
		return nil, err
	}
	defer call.end()
	defer call.resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(call.resp.Body, pd.MaxLegAnswer))
	if err != nil {
		return nil, &prefillLegError{&upstreamError{err: err}}
	}
	took := time.Since(call.sent)
	kv, err := pd.VLLMKVParams(data)
	if err != nil {
		return nil, &prefillLegError{&upstreamError{err: err}}
	}
	// The answer came with the prompt's first token: a time-to-first-token
	// sample for the prefill worker's learned rate.
	call.pre.FirstToken(took)
	g.m.PrefillLeg.WithLabelValues(x.req.Model).Observe(took.Seconds())
	return kv, nil
}
