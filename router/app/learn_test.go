package app

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/shoenig/test/must"
)

// The approximate record learns only prompts an engine accepted: an engine
// that refuses every request (400, as for a prompt over its context) is not
// credited with them, so clients cannot grow the router's index with
// prompts no engine cached (issue #33, item 4). A second engine that
// accepts the same prompt is.
func TestDecisionsLearnOnlyAcceptedPrompts(t *testing.T) {
	refusing := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		io.WriteString(w, `{"error":{"message":"prompt too long","type":"invalid_request_error","param":null,"code":null}}`)
	}))
	t.Cleanup(refusing.Close)
	accepting := newEngine(t, 1, 0)
	cfg := baseConfig(t)
	cfg.Engines = []StaticEngine{
		{Model: "refused", Address: strings.TrimPrefix(refusing.URL, "http://"), Engine: "sim"},
		{Model: "accepted", Address: strings.TrimPrefix(accepting.URL, "http://"), Engine: "sim"},
	}
	cfg.PolicyFile = policyFile(t, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`)
	r := start(t, cfg)

	prompt := strings.Repeat("a long prompt the engine refuses every time it is sent ", 40)
	for range 2 {
		body := fmt.Sprintf(`{"model":"refused","prompt":%q}`, prompt)
		resp, err := http.Post(r.url("http")+"/v1/completions", "application/json", strings.NewReader(body))
		must.NoError(t, err)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		must.Eq(t, http.StatusBadRequest, resp.StatusCode)
	}
	requested, matched := prefixBlocks(t, cfg.Registry, "refused")
	must.Greater(t, 0, requested)
	must.Eq(t, 0.0, matched, must.Sprint("the refused prompt was learned"))
	must.Eq(t, 0, r.cache.ApproxIndex().Stats().Entries)

	for range 2 {
		completePrompt(t, r.url("http"), "accepted", prompt)
	}
	requested, matched = prefixBlocks(t, cfg.Registry, "accepted")
	must.Eq(t, requested/2, matched)
}
