package gateway

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
)

// emptyCache is a prefix source that holds nothing: every prompt token is
// uncached on every worker.
type emptyCache struct{}

func (emptyCache) Keys(dst []uint64, _ string, bs int, tokens []uint32) ([]uint64, error) {
	for i := 0; i+bs <= len(tokens); i += bs {
		dst = append(dst, uint64(i+1))
	}
	return dst, nil
}

func (emptyCache) Match([]uint64, prefixindex.TierWeights, []prefixindex.Match) []prefixindex.Match {
	return nil
}

// The gateway feeds the ttft term's prefill model: a streamed request's
// uncached prompt tokens are pending on its worker until the first event,
// whose delay teaches the worker's prefill rate; a non-streamed request ends
// its prefill without teaching (its response time includes the decode).
func TestGatewayTeachesPrefillRate(t *testing.T) {
	const promptTokens, firstEventDelay = 4000, 40 * time.Millisecond
	release := make(chan struct{})
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Test-Hold") != "" {
			<-release
		}
		time.Sleep(firstEventDelay) // the input: the engine's time to first event
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n")
		w.(http.Flusher).Flush()
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(engine.Close)
	var releaseOnce sync.Once
	unhold := func() { releaseOnce.Do(func() { close(release) }) }

	pool := discovery.New(discovery.Config{})
	pool.Set([]discovery.Instance{{ID: "a", Address: addr(engine), Meta: map[string]string{discovery.MetaModel: "m"}}})
	reg := prometheus.NewRegistry()
	terms, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), scoring.CacheTerms(emptyCache{})...)...)
	must.NoError(t, err)
	doc := &policy.Document{Policy: scoring.Weighted, Weights: map[string]float64{"ttft": 1, "prefix": 1}}
	gw, err := New(Config{Pool: pool, Policy: StaticPolicy{Doc: doc}, Selector: scoring.NewSelector(scoring.SelectorConfig{Registry: terms}),
		Admission: admission.New(), Metrics: metrics.New(reg), Gatherer: reg, Logger: hclog.NewNullLogger(),
		MaxBodyBytes: 1 << 20, Transport: engineTransport(t),
		Prepare: func(r *scoring.Request) {
			r.Tokenize = func(context.Context, *scoring.Request) ([]uint32, error) {
				return make([]uint32, promptTokens), nil
			}
		}})
	must.NoError(t, err)
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	t.Cleanup(unhold) // runs first: a failed assertion must not leave the servers waiting on it
	worker := func() scoring.Signals {
		ws := gw.candidates("m")
		must.SliceLen(t, 1, ws)
		return ws[0].Live.Snapshot()
	}
	post := func(hold, stream bool) {
		body := fmt.Sprintf(`{"model":"m","prompt":"p","stream":%t}`, stream)
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/completions", strings.NewReader(body))
		must.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if hold {
			req.Header.Set("X-Test-Hold", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		must.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		must.Eq(t, http.StatusOK, resp.StatusCode)
	}

	must.Eq(t, float64(scoring.DefaultPrefillRate), worker().PrefillRate)
	// Pending while the engine has not answered.
	done := make(chan struct{})
	go func() { defer close(done); post(true, true) }()
	testutil.Eventually(t, 5*time.Second, "the prompt's tokens pending prefill", func() bool {
		return worker().PendingPrefillTokens == promptTokens
	})
	unhold()
	<-done
	s := worker()
	must.Eq(t, int64(0), s.PendingPrefillTokens)
	// 4,000 tokens in ≥ 40 ms: at most 100k tokens/s, and no longer the seed.
	must.Less(t, float64(promptTokens)/firstEventDelay.Seconds()+1, s.PrefillRate)
	must.NotEq(t, float64(scoring.DefaultPrefillRate), s.PrefillRate)

	learned := s.PrefillRate
	post(false, false)
	s = worker()
	must.Eq(t, int64(0), s.PendingPrefillTokens)
	must.Eq(t, learned, s.PrefillRate)
}
