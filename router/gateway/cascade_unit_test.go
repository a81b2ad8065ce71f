package gateway

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"
)

// A small leg that fails escalates; the client never sees its error.
func TestCascadeSmallFails(t *testing.T) {
	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	defer bad.Close()
	good := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"model":"l","choices":[{"index":0,"message":{"role":"assistant","content":"large"},"finish_reason":"stop"}]}`)
	}))
	defer good.Close()
	doc := parseDoc(t, `{"policy":"round_robin","cascades":{"a":{"small":"s","large":"l","threshold":-1}}}`)
	h := newHarness(t, doc, nil, map[string]string{"s1": "s@" + addr(bad), "l1": "l@" + addr(good)})
	resp := h.post("/v1/chat/completions", `{"model":"a","messages":[{"role":"user","content":"x"}]}`)
	body := readAllString(t, resp)
	must.Eq(t, 200, resp.StatusCode)
	must.Eq(t, "escalated", resp.Header.Get(CascadeHeader))
	must.StrContains(t, body, `"large"`)
	must.Eq(t, 1.0, promtest.ToFloat64(h.m.CascadeRequests.WithLabelValues("a", "small_failed")))
}
