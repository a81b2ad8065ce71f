package app

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// TestOTLPEndpointExportsAtClose: with -otlp-endpoint a request's spans reach the
// receiver over OTLP/HTTP at /v1/traces, flushed when the router stops at the latest.
func TestOTLPEndpointExportsAtClose(t *testing.T) {
	var posts atomic.Int64
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if r.URL.Path == "/v1/traces" && r.Header.Get("Content-Type") == "application/x-protobuf" {
			posts.Add(1)
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
	}))
	defer recv.Close()
	eng := newEngine(t, 3, 0)
	cfg := baseConfig(t, eng.URL)
	cfg.OTLPEndpoint, cfg.TraceSampleRatio = recv.URL, 1
	r := start(t, cfg)
	resp := complete(t, http.DefaultClient, r.url("http"), true)
	_, _ = io.Copy(io.Discard, resp.Body)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	r.cancel()
	<-r.done
	r.done <- nil // for the cleanup
	testutil.EventuallyEvery(t, 5*time.Second, 20*time.Millisecond, "the exporter to post a span after shutdown", func() bool { return posts.Load() > 0 })
}
