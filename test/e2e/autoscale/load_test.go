package autoscale

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// result is one streamed request as its client saw it.
type result struct {
	start time.Time
	ttft  time.Duration // to the first content chunk; 0 when none came
	err   error         // nil: a 200 stream with content and [DONE]
}

// load sends streamed chats open loop: at a rate, each request on its own, whether or not the
// earlier ones were answered (as users arrive); the rate can change while it runs.
type load struct {
	router    string
	maxTokens int

	mu        sync.Mutex
	results   []result
	stopPacer context.CancelFunc
	wg        sync.WaitGroup
	seq       int
}

// setRate sends perSec requests a second from now on (0: none); requests already sent run to
// their end.
func (l *load) setRate(ctx context.Context, perSec float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopPacer != nil {
		l.stopPacer()
		l.stopPacer = nil
	}
	if perSec <= 0 {
		return
	}
	pctx, cancel := context.WithCancel(ctx)
	l.stopPacer = cancel
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		tick := time.NewTicker(time.Duration(float64(time.Second) / perSec))
		defer tick.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-tick.C:
			}
			l.mu.Lock()
			l.seq++
			i := l.seq
			l.mu.Unlock()
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				// Requests run to their end with the test's context: changing the rate never
				// cuts a request, so every failure counted is the stack's.
				r := l.chat(ctx, i)
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
			}()
		}
	}()
}

// stop stops sending, waits for every request sent and returns every result.
func (l *load) stop(ctx context.Context) []result {
	l.setRate(ctx, 0)
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.results)
}

// since returns the results of requests started at or after t.
func (l *load) since(t time.Time) []result {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []result
	for _, r := range l.results {
		if !r.start.Before(t) {
			out = append(out, r)
		}
	}
	return out
}

// chat sends one streamed chat with a prompt of its own (no shared prefix; ~1,000 tokens, so the
// router's prefill model learns from a few requests queued together) and max_tokens, which
// oasis-sim generates exactly.
func (l *load) chat(ctx context.Context, i int) result {
	return streamChat(ctx, l.router, model,
		fmt.Sprintf("Request %d: %s", i, strings.Repeat(fmt.Sprintf("word%d ", i), 300)), l.maxTokens)
}

// readStream reads an SSE chat stream to its end: the time to its first content chunk, or an
// error for an error event, no content or no [DONE].
func readStream(resp *http.Response, start time.Time) (time.Duration, error) {
	var ttft time.Duration
	done := false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			done = true
		case strings.Contains(data, `"error"`):
			return ttft, fmt.Errorf("error event: %s", data)
		case ttft == 0 && strings.Contains(data, `"content":"`) && !strings.Contains(data, `"content":""`):
			ttft = time.Since(start)
		}
	}
	switch {
	case sc.Err() != nil:
		return ttft, sc.Err()
	case ttft == 0 || !done:
		return ttft, fmt.Errorf("stream ended without content or [DONE] (content: %v)", ttft > 0)
	}
	return ttft, nil
}

// ttftP90 is the 90th percentile TTFT of the successful results (nearest rank).
func ttftP90(rs []result) time.Duration {
	var ts []time.Duration
	for _, r := range rs {
		if r.err == nil {
			ts = append(ts, r.ttft)
		}
	}
	if len(ts) == 0 {
		return 0
	}
	slices.Sort(ts)
	return ts[(len(ts)*9+9)/10-1]
}
