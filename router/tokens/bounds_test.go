package tokens

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/metrics"
)

// hugeTokenizer is an engine whose /tokenize answers are far longer than any
// prompt tokenizes to: ids token ids of idText each (a registered engine
// answering 64 MiB took the router's RSS to 1.9 GB, issue #33 item 5).
type hugeTokenizer struct {
	*httptest.Server
	calls   atomic.Int64
	written atomic.Int64
}

func newHugeTokenizer(t *testing.T, ids int, idText string) *hugeTokenizer {
	h := &hugeTokenizer{}
	h.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.calls.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		chunk := strings.Repeat(idText+",", 4096)
		n, _ := io.WriteString(w, `{"count":1,"max_model_len":1,"tokens":[`)
		h.written.Add(int64(n))
		for i := 0; i < ids/4096; i++ {
			n, err := io.WriteString(w, chunk)
			h.written.Add(int64(n))
			if err != nil {
				return
			}
		}
		io.WriteString(w, idText+"]}")
	}))
	t.Cleanup(h.Close)
	return h
}

func (h *hugeTokenizer) replica() Replica {
	return Replica{Address: strings.TrimPrefix(h.URL, "http://"), Engine: "vllm"}
}

// A /tokenize answer longer than its prompt can tokenize to is refused
// unread past the bound, whether it is long in bytes or in (short) ids;
// the engine is counted, left out of the rotation for a while, and the
// prompt is tokenized by another replica, or by Bytes when none is left.
func TestTokenizeAnswerBounded(t *testing.T) {
	cases := []struct {
		name   string
		ids    int
		idText string
		reason string
	}{
		// 64 MiB of JSON for a prompt of a few dozen bytes.
		{"bytes", 6_100_000, "4000000000", "too_large"},
		// Within the byte bound, but more ids than the prompt's bytes.
		{"ids", 20_000, "1", "too_many_tokens"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			bad := newHugeTokenizer(t, tc.ids, tc.idText)
			m := metrics.New(prometheus.NewRegistry())
			refused := m.EngineAnswerRefused.WithLabelValues("vllm", "tokenize")
			only := NewEngine(EngineConfig{Replicas: func(string) []Replica { return []Replica{bad.replica()} }, Metrics: m})
			p := promptOf(t, bodies[3].path, bodies[3].body)
			_, err := only.Tokenize(context.Background(), "sim-model", p)
			must.ErrorIs(t, err, ErrAnswerRefused)
			var ae *AnswerError
			must.True(t, errors.As(err, &ae))
			must.Eq(t, tc.reason, ae.Reason)
			must.Eq(t, 1.0, promtest.ToFloat64(refused))
			if tc.reason == "too_large" {
				// Read no further than the bound (and what the socket buffers hold).
				_, limit := only.answerLimit(tokenizePayload("sim-model", p))
				must.Less(t, limit+8<<20, bad.written.Load())
			}
			// Left out of the rotation: the next prompt costs no round trip.
			_, err = only.Tokenize(context.Background(), "sim-model", promptOf(t, bodies[4].path, bodies[4].body))
			must.ErrorIs(t, err, ErrAnswerRefused)
			must.Eq(t, int64(1), bad.calls.Load())
		})
	}
}

func TestAutoFallsBackWhenTokenizeRefused(t *testing.T) {
	bad := newHugeTokenizer(t, 6_100_000, "4000000000")
	good := simServer(t)
	m := metrics.New(prometheus.NewRegistry())
	reps := []Replica{bad.replica(), {Address: strings.TrimPrefix(good.URL, "http://"), Engine: "vllm"}}
	a := NewAutoEngine(EngineConfig{Replicas: func(string) []Replica { return reps }, Metrics: m})
	must.Eq(t, "engine", a.Mode("sim-model"))
	for i := range 4 {
		body := fmt.Sprintf(`{"model":"sim-model","prompt":"prompt number %d"}`, i)
		p := promptOf(t, "/v1/completions", body)
		got, err := a.Tokenize(context.Background(), "sim-model", p)
		must.NoError(t, err)
		want, err := Sim{}.Tokenize(context.Background(), "sim-model", p)
		must.NoError(t, err)
		must.Eq(t, want, got, must.Sprintf("prompt %d: the other replica's tokens", i))
	}
	must.Eq(t, int64(1), bad.calls.Load())
	must.Eq(t, 1.0, promtest.ToFloat64(m.EngineAnswerRefused.WithLabelValues("vllm", "tokenize")))

	// With no replica left, the prompt's bytes.
	alone := NewAutoEngine(EngineConfig{Replicas: func(string) []Replica { return reps[:1] }})
	p := promptOf(t, bodies[3].path, bodies[3].body)
	for range 2 {
		got, err := alone.Tokenize(context.Background(), "sim-model", p)
		must.NoError(t, err)
		want, err := Bytes{}.Tokenize(context.Background(), "sim-model", p)
		must.NoError(t, err)
		must.Eq(t, want, got)
	}
	must.Eq(t, int64(2), bad.calls.Load())
}
