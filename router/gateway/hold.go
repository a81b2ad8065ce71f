package gateway

import (
	"bytes"
	"slices"
	"sync"
	"time"

	"github.com/oasis-llm/oasis/router/openai"
)

// Engines (vLLM, SGLang, oasis-sim) answer a chat stream with its head and
// a role-only chunk at once, before the prompt is even scheduled. Sent on,
// they commit the router to a worker that may still crash or freeze during
// queueing or prefill, leaving the client a 200 and a cut stream. The
// router holds them back until an event carries a token instead: a failure
// until then is retried on another worker like any failure before the
// first byte, and the client's time to first byte is its time to first
// token, as before.

// maxHeld bounds the bytes held back (a preamble is a few hundred bytes).
const maxHeld = 64 << 10

// holdBuffer keeps the start of an event stream until it carries a token.
type holdBuffer struct {
	data    []byte
	scanned int // data[:scanned] are whole preamble events
}

// feed adds p and reports whether the held bytes must now go to the client:
// an event carries a token, an error, a finish or [DONE], or the hold is
// full.
func (h *holdBuffer) feed(p []byte) bool {
	h.data = append(h.data, p...)
	if len(h.data) > maxHeld {
		return true
	}
	for {
		ev, n := nextEvent(h.data[h.scanned:])
		if n == 0 {
			return false
		}
		h.scanned += n
		if !isPreamble(ev) {
			return true
		}
	}
}

// nextEvent returns the first whole event of b (without its blank line) and
// the bytes it takes, or n == 0 when b holds no whole event yet.
func nextEvent(b []byte) (ev []byte, n int) {
	for _, sep := range []string{"\n\n", "\r\n\r\n"} {
		if i := bytes.Index(b, []byte(sep)); i >= 0 && (n == 0 || i+len(sep) < n) {
			ev, n = b[:i], i+len(sep)
		}
	}
	return ev, n
}

// isPreamble reports whether an SSE event carries nothing for the client
// yet: comments, or data that openai.IsPreamble calls preamble. A named
// event (an engine's error) is passed on.
func isPreamble(ev []byte) bool {
	for _, line := range bytes.Split(ev, []byte("\n")) {
		line = bytes.TrimSuffix(line, []byte("\r"))
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			if bytes.HasPrefix(line, []byte("event:")) {
				return false
			}
			continue // comments, id:, retry:
		}
		if !openai.IsPreamble(data) {
			return false
		}
	}
	return true
}

// Bounds of the automatic hold: twice the model's observed time to first
// token p99, within [minAutoHold, maxAutoHold]; the maximum until enough
// first tokens were seen.
const (
	minAutoHold    = time.Second
	maxAutoHold    = 30 * time.Second
	ttftWindowSize = 256
	ttftMinSamples = 16
)

// holdFor is how long the request's stream may be held for its first token.
func (g *Gateway) holdFor(x *exchange) time.Duration {
	to := x.pol.Timeouts
	if !to.HoldAuto {
		return to.FirstTokenHold
	}
	p99, ok := g.ttft.p99(x.req.Model)
	if !ok {
		return maxAutoHold
	}
	return min(maxAutoHold, max(minAutoHold, 2*p99))
}

// ttftWindows keeps each model's recent times to first token.
type ttftWindows struct{ m sync.Map } // model → *ttftWindow

type ttftWindow struct {
	mu      sync.Mutex
	samples [ttftWindowSize]time.Duration
	n       int           // samples seen
	p99     time.Duration // of the window, recomputed every 16 samples
}

func (t *ttftWindows) observe(model string, d time.Duration) {
	v, ok := t.m.Load(model)
	if !ok {
		v, _ = t.m.LoadOrStore(model, &ttftWindow{})
	}
	w := v.(*ttftWindow)
	w.mu.Lock()
	defer w.mu.Unlock()
	w.samples[w.n%ttftWindowSize] = d
	w.n++
	if w.n%16 == 0 {
		s := slices.Clone(w.samples[:min(w.n, ttftWindowSize)])
		slices.Sort(s)
		w.p99 = s[len(s)*99/100]
	}
}

func (t *ttftWindows) p99(model string) (time.Duration, bool) {
	v, ok := t.m.Load(model)
	if !ok {
		return 0, false
	}
	w := v.(*ttftWindow)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.p99, w.n >= ttftMinSamples
}
