package app

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/discovery"
)

const secretEnv = "OASIS_TEST_ROUTER_SECRET_KEY"

// capture is an OpenAI-compatible endpoint that records what reaches it.
type capture struct {
	*httptest.Server
	mu    sync.Mutex
	auths []string
}

func newCapture(t *testing.T) *capture {
	c := &capture{}
	c.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.mu.Lock()
		c.auths = append(c.auths, r.Header.Get("Authorization"))
		c.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"x","object":"text_completion","choices":[{"index":0,"text":"captured","finish_reason":"stop"}]}`)
	}))
	t.Cleanup(c.Close)
	return c
}

func (c *capture) seen() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.auths...)
}

// hostedRegistration is what anyone allowed to register a service can
// write: a hosted upstream of their choosing and the name of a router
// variable holding a key.
func hostedRegistration(c *capture) map[string]string {
	return map[string]string{discovery.MetaModel: "m", discovery.MetaEngine: "openai_compat",
		discovery.MetaUpstream: c.URL + "/v1", discovery.MetaUpstreamKeyEnv: secretEnv}
}

// hostedCase is a router configuration the exploit runs against.
type hostedCase struct {
	name                 string
	upstreams, keyEnvs   func(c *capture) []string
	used                 bool
	wantRejectedByReason string
}

func hostedCases() []hostedCase {
	return []hostedCase{
		{"default: nothing allowed", nothing, nothing, false, "upstream_not_allowed"},
		{"upstream allowed, key variable not", captureURL, nothing, false, "key_env_not_allowed"},
		{"key variable allowed, upstream not", nothing, secretName, false, "upstream_not_allowed"},
		{"both allowed", captureURL, secretName, true, ""},
	}
}

func nothing(*capture) []string      { return nil }
func captureURL(c *capture) []string { return []string{c.URL + "/v1"} }
func secretName(*capture) []string   { return []string{secretEnv} }

// checkHosted sends a completion for model m through the router and checks
// whether it reached the capture server, with the key, or nothing did.
func checkHosted(t *testing.T, r *running, c *capture, used bool) {
	t.Helper()
	resp := complete(t, http.DefaultClient, r.url("http"), false)
	b, _ := io.ReadAll(resp.Body)
	if used {
		must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(string(b)))
		must.Eq(t, []string{"Bearer sk-do-not-leak"}, c.seen())
		return
	}
	must.NotEq(t, http.StatusOK, resp.StatusCode, must.Sprint(string(b)))
	must.SliceEmpty(t, c.seen())
}

// rejected is oasis_router_hosted_rejected_total{reason}.
func rejected(t *testing.T, reg *prometheus.Registry, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	must.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != "oasis_router_hosted_rejected_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == reason {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// Service meta is untrusted: a registration naming its own upstream and a
// router variable never receives the variable's value unless the operator
// allowed both. The registration is fed to the router's pool as a
// discovery source would.
func TestHostedUpstreamNeedsAllowList(t *testing.T) {
	t.Setenv(secretEnv, "sk-do-not-leak")
	for _, tc := range hostedCases() {
		t.Run(tc.name, func(t *testing.T) {
			c := newCapture(t)
			cfg := baseConfig(t, newEngine(t, 1, 0).URL)
			cfg.Engines[0].Model = "local"
			cfg.HostedUpstreams, cfg.HostedKeyEnvs = tc.upstreams(c), tc.keyEnvs(c)
			r := start(t, cfg)
			testutil.Eventually(t, 10*time.Second, "the local engine in the pool", func() bool { return len(r.Pool().Workers("local")) == 1 })
			r.Pool().Set(append(instances(cfg.Engines), discovery.Instance{ID: "hosted-1", Address: "127.0.0.1:1",
				Meta: hostedRegistration(c)}))
			checkHosted(t, r, c, tc.used)
			if tc.wantRejectedByReason != "" {
				must.Eq(t, 1.0, rejected(t, cfg.Registry, tc.wantRejectedByReason))
			}
		})
	}
}

// The same exploit through a real Consul agent's registration.
func TestHostedUpstreamFromConsulNeedsAllowList(t *testing.T) {
	consul, addr := testutil.StartConsul(t)
	t.Setenv(secretEnv, "sk-do-not-leak")
	for _, tc := range hostedCases() {
		t.Run(tc.name, func(t *testing.T) {
			c := newCapture(t)
			must.NoError(t, consul.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
				ID: "hosted-1", Name: discovery.EngineService, Address: "127.0.0.1", Port: 1, Meta: hostedRegistration(c)}))
			t.Cleanup(func() { consul.Agent().ServiceDeregister("hosted-1") })

			cfg := baseConfig(t)
			cfg.Discovery, cfg.ConsulAddr = DiscoveryConsul, addr
			cfg.HostedUpstreams, cfg.HostedKeyEnvs = tc.upstreams(c), tc.keyEnvs(c)
			r := start(t, cfg)
			testutil.Eventually(t, 10*time.Second, "the registration to be used or refused", func() bool {
				if tc.used {
					return len(r.Pool().Workers("m")) == 1
				}
				return r.Pool().Synced() && rejected(t, cfg.Registry, tc.wantRejectedByReason) == 1
			})
			checkHosted(t, r, c, tc.used)
		})
	}
}
