// Package pd is disaggregated prefill/decode: which workers form pairs,
// which pair a retry takes, when a prompt is worth a remote prefill, and
// the legs' bodies by protocol. The gateway chooses the pair
// (scoring.Selector.PickPair), sends the legs and relays the decode leg's
// answer (router/gateway/disagg.go, pd_*.go).
//
// For a model served by prefill workers (oasis_role=prefill) and decode
// workers (oasis_role=decode) the router chooses a prefill worker and a
// decode worker together and hands the request from one to the other by
// the pair's protocol (oasis_pd_protocol):
//
//   - vllm (NixlConnector, LMCache, MultiConnector): a prefill leg with
//     max_tokens 1 and kv_transfer_params {do_remote_decode: true} first;
//     its answer's kv_transfer_params go unchanged into the decode leg,
//     which is the client's body otherwise (vllm.go).
//   - sglang (bootstrap server): both legs at once, each the client's body
//     with bootstrap_host, bootstrap_port and bootstrap_room; the decode
//     leg's answer is the client's, the prefill leg's is drained (sglang.go).
//
// A prompt with few uncached tokens on the chosen decode worker goes to a
// direct candidate instead (policy disaggregation_min_uncached_tokens).
// Failures: a failed prefill leg is retried on another prefill worker
// (MaxPrefillAttempts in all), then served without a remote prefill when
// the policy allows (disaggregation_fallback "local"); a decode leg that
// fails before the client's first byte is retried once with a new pair
// (RetryPair: it may be the prefill worker's failure); nothing is retried
// after bytes reached the client.
package pd

import (
	"context"
	"slices"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/scoring"
)

// MaxPrefillAttempts bounds the prefill legs of one pair attempt.
const MaxPrefillAttempts = 2

// MaxLegAnswer bounds what the router reads of a prefill leg's answer.
const MaxLegAnswer = 4 << 20

// Direct reports whether w serves a request by itself: not a prefill
// worker, nor an SGLang decode worker (which waits for a prefill peer's KV).
func Direct(w *scoring.Worker) bool {
	return w.Role != discovery.RolePrefill &&
		(w.Role != discovery.RoleDecode || w.PDProtocol != discovery.ProtocolSGLang)
}

// Split splits a model's workers into prefill and decode sides and tells
// whether any may serve directly; nil sides (no allocation) when the model
// has no prefill worker.
func Split(ws []*scoring.Worker) (prefill, decode []*scoring.Worker, direct bool) {
	if !slices.ContainsFunc(ws, func(w *scoring.Worker) bool { return w.Role == discovery.RolePrefill }) {
		return nil, nil, true
	}
	for _, w := range ws {
		switch w.Role {
		case discovery.RolePrefill:
			prefill = append(prefill, w)
		case discovery.RoleDecode:
			decode = append(decode, w)
		}
		direct = direct || Direct(w)
	}
	return prefill, decode, direct
}

// Uncached is the prompt's tokens not in wk's cache by the router's prefix
// index, or, without prompt tokens (no tokenizer), the prompt's length
// estimated from its body (≈4 bytes a token).
func Uncached(req *scoring.Request, body []byte, wk *scoring.Worker) int64 {
	if n, ok := req.UncachedTokens(wk); ok {
		return n
	}
	return int64(len(body) / 4)
}

// RetryPair chooses the pair for the retry after a decode leg failed before
// the first byte. The failure may be the prefill worker's: a decode engine
// whose prefill peer died after answering the prefill leg (or, SGLang,
// after its response head) fails the KV pull and answers 5xx. So the retry
// prefers a pair that shares neither worker with the failed one, then
// another decode worker with the same prefill worker, then the same decode
// worker with another prefill worker (a model with one decode worker).
// prefill are the prefill workers not failed yet, triedD the decode workers
// tried.
func RetryPair(ctx context.Context, sel *scoring.Selector, req *scoring.Request, failed scoring.Pair,
	prefill, decode, triedD []*scoring.Worker) (scoring.Pair, error) {
	otherP := Without(prefill, []*scoring.Worker{failed.Prefill})
	otherD := Without(decode, triedD)
	next, err := sel.PickPair(ctx, req, otherP, otherD)
	if err != nil {
		next, err = sel.PickPair(ctx, req, prefill, otherD)
	}
	if err != nil {
		next, err = sel.PickPair(ctx, req, otherP, []*scoring.Worker{failed.Decode})
	}
	return next, err
}

// Without returns ws less the workers in out (a new slice).
func Without(ws, out []*scoring.Worker) []*scoring.Worker {
	return slices.DeleteFunc(slices.Clone(ws), func(w *scoring.Worker) bool {
		return slices.ContainsFunc(out, func(o *scoring.Worker) bool { return o.ID == w.ID })
	})
}
