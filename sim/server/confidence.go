package server

import (
	"bytes"
	"regexp"
	"strconv"
)

// A request's answer confidence is controllable, so that a router's
// logprob-gated cascade can be tested deterministically: the request field
// "oasis_logprob": -1.5, or else the marker "[oasis:logprob=-1.5]" anywhere in
// the prompt (a completions prompt string, or any chat message's content),
// makes every sampled token's log probability exactly that value (clamped to
// ≤ 0; alternatives in top_logprobs stay below it). Without either, log
// probabilities are drawn at random (mean about -0.5), reproducibly for a
// seeded request.
var logprobMarker = regexp.MustCompile(`\[oasis:logprob=(-?[0-9]+(?:\.[0-9]+)?)\]`)

// confidence returns the fixed log probability req asks for, or nil.
func confidence(req *apiRequest) *float64 {
	if v := req.OasisLogprob; v != nil {
		lp := min(*v, 0)
		return &lp
	}
	if lp, ok := markerLogprob(req.Prompt); ok {
		return &lp
	}
	for _, m := range req.Messages {
		if lp, ok := markerLogprob(m.Content); ok {
			return &lp
		}
	}
	return nil
}

func markerLogprob(raw []byte) (float64, bool) {
	if len(raw) == 0 || !bytes.Contains(raw, []byte("[oasis:logprob=")) {
		return 0, false
	}
	m := logprobMarker.FindSubmatch(raw)
	if m == nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		return 0, false
	}
	return min(v, 0), true
}
