package app

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

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
			must.Wait(t, waitFor(func() bool { return len(r.Pool().Workers("local")) == 1 }))
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
	consul, addr := startConsul(t)
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
			must.Wait(t, waitFor(func() bool {
				if tc.used {
					return len(r.Pool().Workers("m")) == 1
				}
				return r.Pool().Synced() && rejected(t, cfg.Registry, tc.wantRejectedByReason) == 1
			}))
			checkHosted(t, r, c, tc.used)
		})
	}
}

// consulBinary finds a real consul: $OASIS_CONSUL_BIN, the repository's
// bin/consul (make hashistack), or PATH.
func consulBinary() string {
	if p := os.Getenv("OASIS_CONSUL_BIN"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../../bin/consul"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("consul")
	return p
}

// startConsul runs a Consul dev agent on free loopback ports.
func startConsul(t *testing.T) (*consulapi.Client, string) {
	t.Helper()
	bin := consulBinary()
	if bin == "" {
		t.Skip("no consul binary: set OASIS_CONSUL_BIN or run make hashistack (bin/consul)")
	}
	httpAddr := freePort(t)
	port := func(addr string) string { _, p, _ := net.SplitHostPort(addr); return p }
	cmd := exec.Command(bin, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-http-port", port(httpAddr), "-dns-port", "-1", "-serf-lan-port", port(freePort(t)),
		"-serf-wan-port", port(freePort(t)), "-server-port", port(freePort(t)), "-grpc-port", "-1",
		"-grpc-tls-port", "-1", "-data-dir", t.TempDir(), "-log-level", "warn")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	must.NoError(t, cmd.Start())
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("consul output:\n%s", out.String())
		}
	})
	cc := consulapi.DefaultConfig()
	cc.Address = httpAddr
	client, err := consulapi.NewClient(cc)
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		leader, err := client.Status().Leader()
		return err == nil && leader != ""
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)))
	return client, httpAddr
}

// freePort returns a loopback address no one listens on now.
func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer ln.Close()
	return strings.Replace(ln.Addr().String(), "[::1]", "127.0.0.1", 1)
}
