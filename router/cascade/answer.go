package cascade

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/oasis-llm/oasis/router/policy"
)

// Answer is the small model's buffered answer and its gate statistic.
type Answer struct {
	body    []byte
	doc     map[string]json.RawMessage
	usage   Usage
	mean    float64 // mean token log probability
	tokens  int     // tokens with a log probability
	capped  bool    // max_small_tokens lowered the client's budget
	cutOff  bool    // finish_reason "length"
	wantsLP bool    // the client asked for log probabilities
	chat    bool
}

// Usage is an answer's token counts.
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// ErrNotCompletion is a small answer without a first choice.
var ErrNotCompletion = errors.New("the small model's answer has no choices")

// Read reads the small leg's answer body: its usage, finish reasons and
// gate statistic (over the tokens of every choice). Both engines' shapes:
// chat logprobs.content[].logprob (vLLM, SGLang) and completions
// logprobs.token_logprobs[] (null entries, as for an echoed prompt's first
// token, are skipped).
func (a *Answer) Read(body []byte) error {
	a.body = body
	if err := json.Unmarshal(a.body, &a.doc); err != nil {
		return err
	}
	if u := a.doc["usage"]; len(u) > 0 {
		_ = json.Unmarshal(u, &a.usage)
	}
	var choices []struct {
		FinishReason *string `json:"finish_reason"`
		Logprobs     *struct {
			Content []struct {
				Logprob *float64 `json:"logprob"`
			} `json:"content"`
			TokenLogprobs []*float64 `json:"token_logprobs"`
		} `json:"logprobs"`
	}
	if err := json.Unmarshal(a.doc["choices"], &choices); err != nil || len(choices) == 0 {
		return ErrNotCompletion
	}
	var sum float64
	add := func(lp *float64) {
		if lp != nil {
			sum += *lp
			a.tokens++
		}
	}
	for _, ch := range choices {
		a.cutOff = a.cutOff || ch.FinishReason != nil && *ch.FinishReason == "length"
		if ch.Logprobs == nil {
			continue
		}
		for _, e := range ch.Logprobs.Content {
			add(e.Logprob)
		}
		for _, lp := range ch.Logprobs.TokenLogprobs {
			add(lp)
		}
	}
	if a.tokens > 0 {
		a.mean = sum / float64(a.tokens)
	}
	return nil
}

// Accept is the gate: a complete answer (not cut by max_small_tokens) whose
// mean token log probability is at least the threshold. An answer without
// log probabilities (an engine that ignores the request for them) fails it.
func (a *Answer) Accept(c *policy.Cascade) bool {
	return a.tokens > 0 && a.mean >= c.ThresholdValue() && !(a.capped && a.cutOff)
}

// Usage is the small answer's token counts.
func (a *Answer) Usage() Usage { return a.usage }

// SetHeaders puts the small leg's usage and gate statistic in h.
func (a *Answer) SetHeaders(h http.Header) {
	h.Set(SmallPromptTokensHeader, strconv.FormatInt(a.usage.PromptTokens, 10))
	h.Set(SmallCompletionTokensHeader, strconv.FormatInt(a.usage.CompletionTokens, 10))
	if a.tokens > 0 {
		h.Set(SmallLogprobHeader, strconv.FormatFloat(a.mean, 'f', 4, 64))
	}
}
