package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/oasis-llm/oasis/router/openai"
	"github.com/oasis-llm/oasis/router/policy"
)

// Cascade response headers.
const (
	// CascadeHeader says which model answered a cascade alias's request:
	// "small", or "escalated" (the large model).
	CascadeHeader = "X-Oasis-Cascade"
	// The small leg's usage and gate statistic (mean token log
	// probability), on every answer whose small leg answered.
	SmallPromptTokensHeader     = "X-Oasis-Small-Prompt-Tokens"
	SmallCompletionTokensHeader = "X-Oasis-Small-Completion-Tokens"
	SmallLogprobHeader          = "X-Oasis-Small-Logprob"
)

// Cascade outcomes (the outcome label of oasis_router_cascade_requests_total).
const (
	cascadeSmall       = "small"
	cascadeEscalated   = "escalated"
	cascadeSmallFailed = "small_failed"
)

// maxSmallAnswer bounds the buffered small answer; a larger one escalates.
const maxSmallAnswer = 8 << 20

// runCascade serves a request for a cascade alias: the small model first,
// without streaming and with log probabilities; its answer goes to the
// client when its mean token log probability clears the threshold, else the
// request goes to the large model, whose answer is relayed as usual.
func (g *Gateway) runCascade(c *call, cs *policy.Cascade) {
	x, w, rec := c.x, c.w, c.rec
	alias := x.req.Model
	orig, err := decodeObject(x.body)
	if err != nil {
		rec.fail(w, http.StatusBadRequest, "invalid_request_error", "invalid_request", "", err.Error(), 0)
		return
	}
	t0 := time.Now()
	ans, ok := g.smallLeg(c, cs, orig)
	g.m.CascadeLeg.WithLabelValues(alias, "small").Observe(time.Since(t0).Seconds())
	if c.r.Context().Err() != nil {
		rec.status = 499 // the client left while the small model answered
		return
	}
	if c.ctx.Err() != nil {
		g.refuse(c, g.contextRefusal(c, "deadline expired while the small model answered"))
		return
	}
	outcome := cascadeSmallFailed
	if ok {
		g.smallUsage(w.Header(), ans)
		outcome = cascadeEscalated
		if ans.accept(cs) {
			outcome = cascadeSmall
		}
		g.m.CascadeSmallTokens.WithLabelValues(alias, outcome, "prompt").Add(float64(ans.usage.PromptTokens))
		g.m.CascadeSmallTokens.WithLabelValues(alias, outcome, "completion").Add(float64(ans.usage.CompletionTokens))
	}
	g.m.CascadeRequests.WithLabelValues(alias, outcome).Inc()
	if outcome == cascadeSmall {
		rec.recorded = true // the small leg's own record is the request's
		w.Header().Set(CascadeHeader, cascadeSmall)
		g.writeSmall(w, x, ans)
		return
	}
	g.escalate(c, cs, orig)
}

// escalate sends the client's request to the cascade's large model.
func (g *Gateway) escalate(c *call, cs *policy.Cascade, orig map[string]json.RawMessage) {
	body, err := encodeWith(orig, map[string]json.RawMessage{"model": openai.String(cs.Large)})
	var lx *exchange
	if err == nil {
		lx, err = g.derive(c.r, c.x, cs.Large, body)
	}
	if err != nil {
		g.refuse(c, internalError("internal_error", "building the large model's request failed"))
		return
	}
	c.w.Header().Set(CascadeHeader, cascadeEscalated)
	c.rec.model = cs.Large
	t0 := time.Now()
	g.serve(c.with(lx))
	g.m.CascadeLeg.WithLabelValues(c.x.req.Model, "large").Observe(time.Since(t0).Seconds())
}

// smallAnswer is the small model's buffered answer and its gate statistic.
type smallAnswer struct {
	body    []byte
	header  http.Header
	doc     map[string]json.RawMessage
	usage   usageCounts
	mean    float64 // mean token log probability
	tokens  int     // tokens with a log probability
	capped  bool    // max_small_tokens lowered the client's budget
	cutOff  bool    // finish_reason "length"
	wantsLP bool    // the client asked for log probabilities
	chat    bool
}

type usageCounts struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
}

// accept is the gate: a complete answer (not cut by max_small_tokens) whose
// mean token log probability is at least the threshold. An answer without
// log probabilities (an engine that ignores the request for them) fails it.
func (a *smallAnswer) accept(c *policy.Cascade) bool {
	return a.tokens > 0 && a.mean >= c.ThresholdValue() && !(a.capped && a.cutOff)
}

// smallLeg runs the request on the small model, buffered. ok is false when
// the leg failed (no 200 answer, or one that is not a completion).
func (g *Gateway) smallLeg(cl *call, c *policy.Cascade, orig map[string]json.RawMessage) (*smallAnswer, bool) {
	x := cl.x
	ans := &smallAnswer{chat: x.fields.Prompt.Chat}
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
	if n := c.MaxSmallTokens; n > 0 && (!x.fields.HasMaxTokens || x.fields.MaxTokens > n) {
		ans.capped = true
		set["max_tokens"], set["max_completion_tokens"] = json.RawMessage(strconv.Itoa(n)), nil
	}
	body, err := encodeWith(orig, set)
	if err != nil {
		return nil, false
	}
	sx, err := g.derive(cl.r, x, c.Small, body)
	if err != nil {
		return nil, false
	}
	bw := &bufferWriter{h: http.Header{}, status: http.StatusOK}
	g.runBuffered(cl, sx, bw)
	if bw.status != http.StatusOK || bw.over {
		return nil, false
	}
	ans.body, ans.header = bw.buf.Bytes(), bw.h
	return ans, ans.parse() == nil
}

// runBuffered serves sx into bw under its own outcome (the small leg counts
// as a request for the small model). A leg whose engine failed mid-answer
// aborts (http.ErrAbortHandler); that is a failed leg, not a failed client.
func (g *Gateway) runBuffered(cl *call, sx *exchange, bw *bufferWriter) {
	srec := &outcome{g: g, start: time.Now(), model: sx.req.Model, status: http.StatusOK}
	defer srec.done()
	defer func() {
		if v := recover(); v != nil {
			if v != http.ErrAbortHandler { //nolint:errorlint // the sentinel is panicked, not wrapped
				panic(v)
			}
			bw.status, srec.status = http.StatusBadGateway, http.StatusBadGateway
		}
	}()
	g.serve(&call{ctx: cl.ctx, w: bw, r: cl.r, rec: srec, x: sx})
}

// errNotCompletion is a small answer without a first choice.
var errNotCompletion = errors.New("the small model's answer has no choices")

// parse reads the answer's usage, finish reasons and gate statistic (over
// the tokens of every choice). Both
// engines' shapes: chat logprobs.content[].logprob (vLLM, SGLang) and
// completions logprobs.token_logprobs[] (null entries, as for an echoed
// prompt's first token, are skipped).
func (a *smallAnswer) parse() error {
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
		return errNotCompletion
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

// smallUsage puts the small leg's usage and gate statistic in h.
func (g *Gateway) smallUsage(h http.Header, a *smallAnswer) {
	h.Set(SmallPromptTokensHeader, strconv.FormatInt(a.usage.PromptTokens, 10))
	h.Set(SmallCompletionTokensHeader, strconv.FormatInt(a.usage.CompletionTokens, 10))
	if a.tokens > 0 {
		h.Set(SmallLogprobHeader, strconv.FormatFloat(a.mean, 'f', 4, 64))
	}
}

// bufferWriter is the http.ResponseWriter of a buffered leg.
type bufferWriter struct {
	h      http.Header
	status int
	wrote  bool
	over   bool
	buf    bytes.Buffer
}

func (b *bufferWriter) Header() http.Header { return b.h }

func (b *bufferWriter) WriteHeader(status int) {
	if !b.wrote {
		b.status, b.wrote = status, true
	}
}

func (b *bufferWriter) Write(p []byte) (int, error) {
	b.WriteHeader(http.StatusOK)
	if b.buf.Len()+len(p) > maxSmallAnswer {
		b.over = true
		return 0, errAnswerTooLarge
	}
	return b.buf.Write(p)
}

var errAnswerTooLarge = errors.New("the small model's answer exceeds the cascade's buffer")

// decodeObject decodes a JSON object's members, raw.
func decodeObject(body []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, errors.New("the request body must be a JSON object")
	}
	return m, nil
}

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
