package faults

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// outcome is how one request ended, judged as a client would.
type outcome int

const (
	// outcomeOK: a whole answer, or a stream with tokens, a finish reason and [DONE].
	outcomeOK outcome = iota
	// outcomeClean: an error the client is told about: an HTTP 5xx with an
	// OpenAI error body (503 also with Retry-After), or an SSE error event
	// followed by [DONE] and a proper end of the body.
	outcomeClean
	// outcomeLost: anything else: a reset connection, a stream cut without an error
	// event, no answer by the client's deadline, a 4xx, a malformed answer
	// or one from another model.
	outcomeLost
)

func (o outcome) String() string { return [...]string{"ok", "clean error", "LOST"}[o] }

// result is one request of the load.
type result struct {
	stream     bool
	start, end time.Time
	outcome    outcome
	status     int
	code       string // the error code of a clean error
	tokens     int    // content chunks a stream delivered
	text       string // a stream's content
	body       string // the request sent
	detail     string // why it was lost
}

func (r result) String() string {
	kind := "whole"
	if r.stream {
		kind = "stream"
	}
	return fmt.Sprintf("%s %s after %s: HTTP %d %s%s (%d tokens)", kind, r.outcome,
		r.end.Sub(r.start).Round(time.Millisecond), r.status, r.code, r.detail, r.tokens)
}

// loadConfig shapes a load.
type loadConfig struct {
	url     string
	model   string
	clients int // each sends one request after another, streamed and whole in turn
	// deadline goes to the router in X-Oasis-Deadline-Ms; the client waits
	// hangGrace longer before it counts the request lost.
	deadline time.Duration
}

const (
	streamTokens = 40 // decode steps: a fault finds streams in the middle
	wholeTokens  = 12
	hangGrace    = 5 * time.Second
)

// load is a running load generator.
type load struct {
	cfg    loadConfig
	client *http.Client
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	results []result
}

// startLoad starts cfg.clients clients; Stop (also run when the test ends)
// waits for their last requests.
func startLoad(t *testing.T, cfg loadConfig) *load {
	tr := &http.Transport{MaxIdleConnsPerHost: cfg.clients, DisableCompression: true}
	l := &load{cfg: cfg, client: &http.Client{Transport: tr}}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for c := range cfg.clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				r := l.do(fmt.Sprintf("client %d request %d", c, n), (c+n)%2 == 0)
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}
		}()
	}
	t.Cleanup(func() { l.Stop(); tr.CloseIdleConnections() })
	return l
}

// Stop lets every client finish its current request and returns all results.
func (l *load) Stop() []result {
	l.cancel()
	l.wg.Wait()
	return l.snapshot()
}

func (l *load) snapshot() []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]result(nil), l.results...)
}

// do sends one request. Its context is not the load's: a request is never
// abandoned by the generator, only by its own deadline.
func (l *load) do(name string, stream bool) result {
	maxTokens := wholeTokens
	if stream {
		maxTokens = streamTokens
	}
	// The name first, so that no two prompts share a cached prefix: every
	// request prefills. A seed makes oasis-sim's answer a function of the
	// context (greedy), so a stream migrated to another engine can be
	// compared with the uninterrupted answer (replay).
	prompt := name + ": " + strings.Repeat("tell me a long story about the sea ", 6)
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":%q}],"max_tokens":%d,"seed":7,"stream":%t}`,
		l.cfg.model, prompt, maxTokens, stream)
	return l.send(body, stream)
}

// replay sends r's request again.
func (l *load) replay(r result) result { return l.send(r.body, r.stream) }

// send sends one request body and judges its answer.
func (l *load) send(body string, stream bool) (r result) {
	r = result{stream: stream, start: time.Now(), body: body}
	defer func() { r.end = time.Now() }()
	ctx, cancel := context.WithTimeout(context.Background(), l.cfg.deadline+hangGrace)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, l.cfg.url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		panic(err) // a fixed, valid request
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Oasis-Deadline-Ms", strconv.FormatInt(l.cfg.deadline.Milliseconds(), 10))
	resp, err := l.client.Do(req)
	if err != nil {
		return r.lose(ctx, "request: "+err.Error())
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	switch {
	case resp.StatusCode != http.StatusOK:
		return r.judgeError(ctx, resp)
	case stream:
		return r.judgeStream(ctx, resp, l.cfg.model)
	default:
		return r.judgeWhole(ctx, resp, l.cfg.model)
	}
}

func (r result) lose(ctx context.Context, detail string) result {
	if ctx.Err() != nil {
		detail = "no answer by the client's deadline: " + detail
	}
	r.outcome, r.detail = outcomeLost, detail
	return r
}

// apiError is OpenAI's error shape.
type apiError struct {
	Error *struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Code    *string `json:"code"`
	} `json:"error"`
}

// parse reports whether data is an OpenAI error with a message, a type and
// a code.
func (e *apiError) parse(data []byte) bool {
	return json.Unmarshal(data, e) == nil && e.Error != nil && e.Error.Message != "" &&
		e.Error.Type != "" && e.Error.Code != nil && *e.Error.Code != ""
}

// judgeError: a 5xx with an OpenAI error body is a clean error (a 503 must
// also say when to retry); any other status is lost.
func (r result) judgeError(ctx context.Context, resp *http.Response) result {
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return r.lose(ctx, "reading the error body: "+err.Error())
	}
	var e apiError
	switch {
	case resp.StatusCode < 500:
		return r.lose(ctx, "client error: "+string(data))
	case !e.parse(data):
		return r.lose(ctx, "not an OpenAI error: "+string(data))
	case resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get("Retry-After") == "":
		return r.lose(ctx, "503 without Retry-After")
	}
	r.outcome, r.code = outcomeClean, *e.Error.Code
	return r
}

// chunk is the part of a chat completion (chunk or whole) the load checks.
type chunk struct {
	Model   string `json:"model"`
	Choices []struct {
		Delta        struct{ Content string } `json:"delta"`
		Message      struct{ Content string } `json:"message"`
		FinishReason *string                  `json:"finish_reason"`
	} `json:"choices"`
}

func (c chunk) finished() bool {
	return len(c.Choices) == 1 && c.Choices[0].FinishReason != nil && *c.Choices[0].FinishReason != ""
}

// judgeWhole: a whole answer of the right model with content and a finish
// reason is ok; a body cut short is lost.
func (r result) judgeWhole(ctx context.Context, resp *http.Response, model string) result {
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return r.lose(ctx, "reading the answer: "+err.Error())
	}
	var c chunk
	switch {
	case json.Unmarshal(data, &c) != nil:
		return r.lose(ctx, "malformed answer: "+string(data))
	case c.Model != model:
		return r.lose(ctx, "answer from model "+strconv.Quote(c.Model))
	case !c.finished() || c.Choices[0].Message.Content == "":
		return r.lose(ctx, "answer without content or finish reason: "+string(data))
	}
	r.outcome = outcomeOK
	return r
}

// judgeStream reads an event stream to its end. Ok: tokens, a finish reason,
// [DONE] last and a proper end of the body. Clean error: an error event,
// then [DONE], then the end. Anything else is lost.
func (r result) judgeStream(ctx context.Context, resp *http.Response, model string) result {
	br := bufio.NewReader(resp.Body)
	var done, finished bool
	code := ""
	for {
		line, err := br.ReadString('\n')
		if data, isData := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: "); isData {
			var e apiError
			var c chunk
			switch {
			case done:
				return r.lose(ctx, "data after [DONE]")
			case data == "[DONE]":
				done = true
			case code != "":
				return r.lose(ctx, "data after the error event")
			case strings.HasPrefix(data, `{"error"`):
				if !e.parse([]byte(data)) {
					return r.lose(ctx, "malformed error event: "+data)
				}
				code = *e.Error.Code
			case json.Unmarshal([]byte(data), &c) != nil:
				return r.lose(ctx, "malformed event: "+data)
			case c.Model != model:
				return r.lose(ctx, "event from model "+strconv.Quote(c.Model))
			default:
				if len(c.Choices) == 1 && c.Choices[0].Delta.Content != "" {
					r.tokens++
					r.text += c.Choices[0].Delta.Content
				}
				finished = finished || c.finished()
			}
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return r.lose(ctx, "stream cut: "+err.Error())
		}
	}
	switch {
	case !done:
		return r.lose(ctx, "stream ended without [DONE]")
	case code != "":
		r.outcome, r.code = outcomeClean, code
	case !finished || r.tokens == 0:
		return r.lose(ctx, "stream without tokens or finish reason")
	default:
		r.outcome = outcomeOK
	}
	return r
}

// tally counts results.
type tally struct {
	total, ok, clean, lost int
	events                 int // clean errors sent as an SSE error event in a 200 stream
	eventsAfterToken       int // those that came after at least one token
	maxLatency             time.Duration
}

func count(rs []result) tally {
	var t tally
	for _, r := range rs {
		t.total++
		switch r.outcome {
		case outcomeOK:
			t.ok++
		case outcomeClean:
			t.clean++
			if r.status == http.StatusOK {
				t.events++
				if r.tokens > 0 {
					t.eventsAfterToken++
				}
			}
		case outcomeLost:
			t.lost++
		}
		t.maxLatency = max(t.maxLatency, r.end.Sub(r.start))
	}
	return t
}

func (t tally) String() string {
	return fmt.Sprintf("%d requests: %d ok, %d clean errors (%d SSE error events, %d of them after a token), %d LOST; slowest %s",
		t.total, t.ok, t.clean, t.events, t.eventsAfterToken, t.lost, t.maxLatency.Round(time.Millisecond))
}

// phases splits results at a fault and the moment the system had recovered:
// before (ended before the fault), during (in flight at some time between the
// two), after (started once recovered).
func phases(rs []result, fault, recovered time.Time) (before, during, after []result) {
	for _, r := range rs {
		switch {
		case r.end.Before(fault):
			before = append(before, r)
		case !r.start.Before(recovered):
			after = append(after, r)
		default:
			during = append(during, r)
		}
	}
	return before, during, after
}

// report logs each phase's tally and every request that did not end ok.
func report(t *testing.T, rs []result, fault, recovered time.Time) (before, during, after tally) {
	t.Helper()
	b, d, a := phases(rs, fault, recovered)
	before, during, after = count(b), count(d), count(a)
	t.Logf("before the fault: %s", before)
	t.Logf("from the fault to recovery (%s): %s", recovered.Sub(fault).Round(time.Millisecond), during)
	t.Logf("after recovery: %s", after)
	for _, r := range rs {
		if r.outcome != outcomeOK {
			t.Logf("  %s, started %s after the fault", r, r.start.Sub(fault).Round(time.Millisecond))
		}
	}
	return before, during, after
}
