// Package cascade is a cascade alias's request (policy cascades): the small
// model's leg (buffered, with log probabilities), the gate its answer must
// clear (mean token log probability at least the policy's threshold), the
// large model's leg, and an accepted small answer in the shape the client
// asked for. The gateway runs the legs (router/gateway/cascade.go): the
// small one buffered into a Buffer, the large one relayed as any request.
package cascade

import (
	"encoding/json"
	"errors"
	"strconv"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
)

// Response headers of a cascade alias's answer.
const (
	// Header says which model answered: "small", or "escalated" (the
	// large model).
	Header = "X-Oasis-Cascade"
	// The small leg's usage and gate statistic (mean token log
	// probability), on every answer whose small leg answered.
	SmallPromptTokensHeader     = "X-Oasis-Small-Prompt-Tokens"
	SmallCompletionTokensHeader = "X-Oasis-Small-Completion-Tokens"
	SmallLogprobHeader          = "X-Oasis-Small-Logprob"
)

// Outcomes (the outcome label of oasis_router_cascade_requests_total, and
// Header's values).
const (
	Small       = "small"
	Escalated   = "escalated"
	SmallFailed = "small_failed"
)

// SmallRequest returns the small leg's body for the client's body (orig,
// its members; f, its fields) and the Answer that will read its answer:
// not streamed, with log probabilities, and at most c.MaxSmallTokens
// tokens.
func SmallRequest(orig map[string]json.RawMessage, f openai.Request, c *policy.Cascade) ([]byte, *Answer, error) {
	ans := &Answer{chat: f.Prompt.Chat}
	set := map[string]json.RawMessage{"model": openai.String(c.Small), "stream": nil, "stream_options": nil}
	if ans.chat {
		ans.wantsLP = string(orig["logprobs"]) == "true"
		set["logprobs"] = json.RawMessage("true")
	} else {
		lp, has := orig["logprobs"]
		ans.wantsLP = has && string(lp) != "null"
		if !ans.wantsLP || string(lp) == "0" {
			set["logprobs"] = json.RawMessage("1")
		}
	}
	if n := c.MaxSmallTokens; n > 0 && (!f.HasMaxTokens || f.MaxTokens > n) {
		ans.capped = true
		set["max_tokens"], set["max_completion_tokens"] = json.RawMessage(strconv.Itoa(n)), nil
	}
	body, err := encodeWith(orig, set)
	if err != nil {
		return nil, nil, err
	}
	return body, ans, nil
}

// LargeBody is the large leg's body: the client's, for c.Large.
func LargeBody(orig map[string]json.RawMessage, c *policy.Cascade) ([]byte, error) {
	return encodeWith(orig, map[string]json.RawMessage{"model": openai.String(c.Large)})
}

// DecodeObject decodes a JSON object's members, raw.
func DecodeObject(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, errNotObject
	}
	return m, nil
}

var errNotObject = errors.New("the request body must be a JSON object")

// encodeWith encodes m with the members of set replaced (nil deletes one),
// leaving m itself unchanged.
func encodeWith(m, set map[string]json.RawMessage) ([]byte, error) {
	out := make(map[string]json.RawMessage, len(m)+len(set))
	for k, v := range m {
		out[k] = v
	}
	for k, v := range set {
		if v == nil {
			delete(out, k)
		} else {
			out[k] = v
		}
	}
	return json.Marshal(out)
}
