package gateway

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/admission"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/scoring"
)

// A hosted endpoint (oasis_upstream) is reached over TLS at its base URL with the key from the
// router's environment, and its stream is passed through like an engine's.
func TestHostedUpstream(t *testing.T) {
	type seen struct{ path, auth, body string }
	got := make(chan seen, 1)
	hosted := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.URL.Path, r.Header.Get("Authorization"), string(b)}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n")
	}))
	defer hosted.Close()
	t.Setenv("OASIS_TEST_HOSTED_KEY", "sk-hosted")

	cases := []struct {
		name, keyEnv, clientAuth, wantAuth string
	}{
		{"router key replaces the client's", "OASIS_TEST_HOSTED_KEY", "Bearer client", "Bearer sk-hosted"},
		{"no key configured passes the client's through", "", "Bearer client", "Bearer client"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			hp, err := discovery.ParseHostedPolicy([]string{hosted.URL + "/v1"}, []string{"OASIS_TEST_HOSTED_KEY"})
			must.NoError(t, err)
			pool := discovery.New(discovery.Config{Hosted: hp})
			pool.Set([]discovery.Instance{{ID: "hosted-1", Address: "127.0.0.1:1", Meta: map[string]string{
				discovery.MetaModel: "gpt-x", discovery.MetaEngine: "openai_compat",
				discovery.MetaUpstream: hosted.URL + "/v1", discovery.MetaUpstreamKeyEnv: tc.keyEnv,
			}}})
			reg := prometheus.NewRegistry()
			terms, err := scoring.NewRegistry(scoring.BuiltinTerms()...)
			must.NoError(t, err)
			gw, err := New(Config{Pool: pool, Policy: StaticPolicy{Doc: &policy.Document{Policy: scoring.RoundRobin}},
				Selector: scoring.NewSelector(scoring.SelectorConfig{Registry: terms}), Admission: admission.New(), Metrics: metrics.New(reg), Gatherer: reg,
				Logger: hclog.NewNullLogger(), HostedTransport: hosted.Client().Transport})
			must.NoError(t, err)
			srv := httptest.NewServer(gw)
			defer srv.Close()

			body := `{"model":"gpt-x","stream":true,"messages":[{"role":"user","content":"hello"}]}`
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Authorization", tc.clientAuth)
			resp, err := http.DefaultClient.Do(req)
			must.NoError(t, err)
			defer resp.Body.Close()
			must.Eq(t, http.StatusOK, resp.StatusCode)
			var lines []string
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				if sc.Text() != "" {
					lines = append(lines, sc.Text())
				}
			}
			must.Eq(t, []string{`data: {"choices":[{"delta":{"content":"hi"}}]}`, "data: [DONE]"}, lines)

			s := <-got
			must.Eq(t, "/v1/chat/completions", s.path)
			must.Eq(t, tc.wantAuth, s.auth)
			// The client's body, but for the usage the router asks of every stream.
			must.Eq(t, strings.TrimSuffix(body, "}")+`,"stream_options":{"include_usage":true}}`, s.body)
		})
	}
}
