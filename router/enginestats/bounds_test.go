package enginestats

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
)

// A registered engine's metrics page is read up to a bound: a page past it
// (a 100 MB one took the router's RSS to 0.8 GB, issue #33 item 5) is
// refused unread past the bound, whether the engine declares its length or
// streams it, and counted; the engine's signals are unknown until it
// serves a page of sane size again.
func TestScraperRefusesOversizedPage(t *testing.T) {
	for _, declared := range []bool{false, true} {
		t.Run(fmt.Sprintf("content-length %v", declared), func(t *testing.T) {
			var huge atomic.Bool
			var written atomic.Int64
			pad := strings.Repeat("# padding an engine may serve, or a registrant who wants the router's memory\n", 1024)
			const pages = 1300 // 1300 × 77 KiB ≈ 100 MiB
			e := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if declared && huge.Load() {
					w.Header().Set("Content-Length", fmt.Sprint(len("vllm:num_requests_running 2\n")+pages*len(pad)))
				}
				io.WriteString(w, "vllm:num_requests_running 2\n")
				if !huge.Load() {
					return
				}
				for range pages {
					n, err := io.WriteString(w, pad)
					written.Add(int64(n))
					if err != nil {
						return
					}
				}
			}))
			t.Cleanup(e.Close)
			pool := discovery.New(discovery.Config{})
			pool.Set([]discovery.Instance{{ID: "w", Address: strings.TrimPrefix(e.URL, "http://"),
				Meta: map[string]string{discovery.MetaModel: "m", discovery.MetaEngine: "vllm"}}})
			m := metrics.New(prometheus.NewRegistry())
			s, err := NewScraper(ScraperConfig{Pool: pool, HTTP: e.Client(), Metrics: m})
			must.NoError(t, err)
			w := pool.Workers("m")[0]

			s.scrapeAll(context.Background(), 10*time.Second)
			must.True(t, w.Signals().EngineMetrics)

			huge.Store(true)
			s.scrapeAll(context.Background(), 10*time.Second)
			must.False(t, w.Signals().EngineMetrics)
			must.Eq(t, 1.0, testutil.ToFloat64(m.EngineAnswerRefused.WithLabelValues("vllm", "metrics")))
			must.Eq(t, 1.0, testutil.ToFloat64(m.ScrapeErrors.WithLabelValues("w")))
			// Not read much past the bound (what the socket buffers hold).
			must.Less(t, int64(DefaultMaxMetricsBytes+24<<20), written.Load())

			huge.Store(false)
			s.scrapeAll(context.Background(), 10*time.Second)
			must.True(t, w.Signals().EngineMetrics)
			must.Eq(t, 2.0, w.Signals().Running)
		})
	}
}
