package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/discovery"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"
)

// engine is an httptest OpenAI-compatible engine. A completion whose prompt
// starts with "stream" is answered with events spaced by gap; any other
// with one JSON body.
type engine struct {
	*httptest.Server
	events int
	gap    time.Duration
}

func newEngine(t *testing.T, events int, gap time.Duration) *engine {
	e := &engine{events: events, gap: gap}
	e.Server = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.Close)
	return e
}

func (e *engine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path == "/metrics" {
		return
	}
	var body struct {
		Prompt string `json:"prompt"`
		Stream bool   `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	if !body.Stream {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"hello","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range e.events {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"t%d\"}]}\n\n", i)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-time.After(e.gap):
		}
	}
	io.WriteString(w, "data: [DONE]\n\n")
}

// wantEvents are the data lines of a whole stream from engine.serve.
func wantEvents(n int) []string {
	out := make([]string, 0, n+1)
	for i := range n {
		out = append(out, fmt.Sprintf(`data: {"choices":[{"index":0,"text":"t%d"}]}`, i))
	}
	return append(out, "data: [DONE]")
}

// readEvents reads an SSE body's data lines to its end.
func readEvents(t *testing.T, r io.Reader) []string {
	t.Helper()
	var out []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if sc.Text() != "" {
			out = append(out, sc.Text())
		}
	}
	must.NoError(t, sc.Err())
	return out
}

// testLogger writes the app's logs to the test's log.
func testLogger(t *testing.T) hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "router", Level: hclog.Debug, Output: tlog{t}})
}

type tlog struct{ t *testing.T }

func (l tlog) Write(p []byte) (int, error) {
	l.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// policyFile writes a policy document and returns its path.
func policyFile(t *testing.T, doc string) string {
	p := filepath.Join(t.TempDir(), "policy.json")
	must.NoError(t, os.WriteFile(p, []byte(doc), 0o600))
	return p
}

// baseConfig is a static-discovery router of model "m" on the engines,
// round robin, nothing else running in the background.
func baseConfig(t *testing.T, engines ...string) Config {
	cfg := Config{Listen: "127.0.0.1:0", Discovery: DiscoveryStatic, PolicyFile: policyFile(t, `{"policy":"round_robin"}`),
		Logger: testLogger(t), Registry: prometheus.NewRegistry(), ShutdownTimeout: 10 * time.Second}
	for _, e := range engines {
		cfg.Engines = append(cfg.Engines, StaticEngine{Model: "m", Address: strings.TrimPrefix(e, "http://")})
	}
	return cfg
}

// running is an App serving in the background.
type running struct {
	*App
	cancel context.CancelFunc
	done   chan error
}

// start builds and runs an App; the test's cleanup stops it.
func start(t *testing.T, cfg Config) *running {
	t.Helper()
	return startTuned(t, cfg, nil)
}

func (r *running) url(scheme string) string { return scheme + "://" + r.Addr().String() }

// complete posts a completion and returns the response.
func complete(t *testing.T, c *http.Client, base string, stream bool) *http.Response {
	t.Helper()
	resp, err := c.Post(base+"/v1/completions", "application/json",
		strings.NewReader(fmt.Sprintf(`{"model":"m","prompt":"stream me","stream":%t}`, stream)))
	must.NoError(t, err)
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

func TestStaticRouterServesCompletion(t *testing.T) {
	eng := newEngine(t, 3, 0)
	cfg := baseConfig(t, eng.URL)
	r := start(t, cfg)

	resp := complete(t, http.DefaultClient, r.url("http"), false)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	var body struct {
		Choices []struct{ Text string } `json:"choices"`
	}
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
	must.Eq(t, "hello", body.Choices[0].Text)

	resp = complete(t, http.DefaultClient, r.url("http"), true)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	must.Eq(t, wantEvents(3), readEvents(t, resp.Body))

	for path, want := range map[string]string{"/health": "ok", "/v1/models": `"id":"m"`,
		"/metrics": `oasis_router_requests_total{model="m",status="200"`} {
		resp, err := http.Get(r.url("http") + path)
		must.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(path))
		must.StrContains(t, string(b), want)
	}
}

func TestParseEngines(t *testing.T) {
	cases := []struct {
		in      string
		want    []StaticEngine
		wantErr string
	}{
		{"", nil, ""},
		{"m=127.0.0.1:9000", []StaticEngine{{Model: "m", Address: "127.0.0.1:9000"}}, ""},
		{" a=h1:1 , b=h2:2@sim ,", []StaticEngine{{Model: "a", Address: "h1:1"}, {Model: "b", Address: "h2:2", Engine: "sim"}}, ""},
		{"m=[::1]:9000@vllm", []StaticEngine{{Model: "m", Address: "[::1]:9000", Engine: "vllm"}}, ""},
		{"org/model-7b=10.0.0.1:8000", []StaticEngine{{Model: "org/model-7b", Address: "10.0.0.1:8000"}}, ""},
		{"127.0.0.1:9000", nil, "want model=host:port"},
		{"=127.0.0.1:9000", nil, "want model=host:port"},
		{"m=127.0.0.1", nil, "missing port"},
		{"m=127.0.0.1:", nil, "missing port"},
		{"m=127.0.0.1:9000@", nil, "empty engine"},
		{"a=h:1,b", nil, "entry 1"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			got, err := ParseEngines(tc.in)
			if tc.wantErr != "" {
				var ce *ConfigError
				must.True(t, errors.As(err, &ce), must.Sprint(err))
				must.Eq(t, "-engines", ce.Flag)
				must.StrContains(t, err.Error(), tc.wantErr)
				return
			}
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
}

// A static engine's @engine fills oasis_engine.
func TestStaticEngineNamesItsEngine(t *testing.T) {
	cfg := baseConfig(t)
	cfg.Engines = []StaticEngine{{Model: "m", Address: "127.0.0.1:1", Engine: "sim"}, {Model: "m", Address: "127.0.0.1:2"}}
	r := start(t, cfg)
	testutil.Eventually(t, 10*time.Second, "both static engines in the pool", func() bool { return len(r.Pool().Workers("m")) == 2 })
	ws := r.Pool().Workers("m")
	must.Eq(t, "sim", ws[0].Engine)
	must.Eq(t, "", ws[1].Engine)
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, data string) string {
		p := filepath.Join(dir, name)
		must.NoError(t, os.WriteFile(p, []byte(data), 0o600))
		return p
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	must.NoError(t, err)
	defer busy.Close()
	pki := newPKI(t)
	badPolicy := write("bad-policy.json", `{"policy":"fastest"}`)
	junk := write("junk.pem", "not PEM")

	cases := []struct {
		name string
		edit func(*Config)
		flag string
	}{
		{"listen without port", func(c *Config) { c.Listen = "127.0.0.1" }, "-listen"},
		{"listen address in use", func(c *Config) { c.Listen = busy.Addr().String() }, "-listen"},
		{"unknown discovery", func(c *Config) { c.Discovery = "dns" }, "-discovery"},
		{"negative ejection time", func(c *Config) { c.EjectFor = -time.Second }, "-eject-for"},
		{"static without engines", func(c *Config) { c.Engines = nil }, "-engines"},
		{"engines with consul", func(c *Config) { c.Discovery = DiscoveryConsul }, "-engines"},
		{"engine without model", func(c *Config) { c.Engines = []StaticEngine{{Address: "h:1"}} }, "-engines"},
		{"engine without port", func(c *Config) { c.Engines = []StaticEngine{{Model: "m", Address: "h"}} }, "-engines"},
		{"both key sources", func(c *Config) { c.APIKeysFile, c.APIKeysKV = junk, true }, "-api-keys-kv"},
		{"bad API keys file", func(c *Config) { c.APIKeysFile = junk }, "-api-keys-file"},
		{"negative body size", func(c *Config) { c.MaxBodyBytes = -1 }, "-max-body-bytes"},
		{"negative body read timeout", func(c *Config) { c.BodyReadTimeout = -time.Second }, "-body-read-timeout"},
		{"negative header size", func(c *Config) { c.MaxHeaderBytes = -1 }, "-max-header-bytes"},
		{"negative connections", func(c *Config) { c.MaxConnections = -1 }, "-max-connections"},
		{"negative scrape interval", func(c *Config) { c.ScrapeInterval = -time.Second }, "-scrape-interval"},
		{"negative shutdown timeout", func(c *Config) { c.ShutdownTimeout = -time.Second }, "-shutdown-timeout"},
		{"negative kvcached blocks", func(c *Config) { c.KVCachedMaxBlocks = -1 }, "-kvcached-max-blocks"},
		{"bad advertise", func(c *Config) { c.Advertise = "nowhere" }, "-advertise"},
		{"bad pprof address", func(c *Config) { c.PprofListen = "6060" }, "-pprof-listen"},
		{"missing policy file", func(c *Config) { c.PolicyFile = filepath.Join(dir, "none.json") }, "-policy-file"},
		{"invalid policy", func(c *Config) { c.PolicyFile = badPolicy }, "-policy-file"},
		{"certificate without key", func(c *Config) { c.TLSCert = pki.serverCert }, "-tls-key"},
		{"key without certificate", func(c *Config) { c.TLSKey = pki.serverKey }, "-tls-cert"},
		{"client CA without certificate", func(c *Config) { c.TLSClientCA = pki.clientCAFile }, "-tls-cert"},
		{"missing certificate file", func(c *Config) {
			c.TLSCert, c.TLSKey = filepath.Join(dir, "none.pem"), pki.serverKey
		}, "-tls-cert"},
		{"key of another certificate", func(c *Config) { c.TLSCert, c.TLSKey = pki.serverCert, pki.clientKey }, "-tls-key"},
		{"client CA not PEM", func(c *Config) {
			c.TLSCert, c.TLSKey, c.TLSClientCA = pki.serverCert, pki.serverKey, junk
		}, "-tls-client-ca"},
		{"hosted upstream over http", func(c *Config) { c.HostedUpstreams = []string{"http://api.example.com/v1"} }, "-hosted-upstreams"},
		{"hosted upstream wildcard TLD", func(c *Config) { c.HostedUpstreams = []string{"https://*.com"} }, "-hosted-upstreams"},
		{"federation cert without listener", func(c *Config) { c.FederationTLSCert = pki.serverCert }, "-federation-tls-cert"},
		{"federation listener without port", func(c *Config) { c.FederationListen = "127.0.0.1" }, "-federation-listen"},
		{"federation listener without certificates", func(c *Config) { c.FederationListen = "127.0.0.1:0" }, "-federation-tls-cert"},
		{"federation without datacenter or Consul", func(c *Config) {
			c.FederationListen, c.PolicyFile = "127.0.0.1:0", write("p.json", `{"policy":"round_robin"}`)
			c.FederationTLSCert, c.FederationTLSKey, c.FederationTLSCA = pki.serverCert, pki.serverKey, pki.clientCAFile
		}, "-federation-dc"},
		{"federation certificate naming no datacenter", func(c *Config) {
			c.FederationListen, c.FederationDC, c.PolicyFile = "127.0.0.1:0", "dc1", write("p.json", `{"policy":"round_robin"}`)
			c.FederationTLSCert, c.FederationTLSKey, c.FederationTLSCA = pki.serverCert, pki.serverKey, pki.clientCAFile
		}, "-federation-tls-cert"},
		{"federation CA not PEM", func(c *Config) {
			c.FederationListen, c.FederationDC = "127.0.0.1:0", "dc1"
			c.FederationTLSCert, c.FederationTLSKey, c.FederationTLSCA = pki.serverCert, pki.serverKey, junk
		}, "-federation-tls-ca"},
		{"sample ratio above 1", func(c *Config) { c.TraceSampleRatio = 1.5 }, "-trace-sample-ratio"},
		{"OTLP endpoint without scheme", func(c *Config) { c.OTLPEndpoint = "127.0.0.1:4318" }, "-otlp-endpoint"},
		{"OTLP endpoint without port", func(c *Config) { c.OTLPEndpoint = "http://collector" }, "-otlp-endpoint"},
		{"hosted key variable name", func(c *Config) { c.HostedKeyEnvs = []string{"NOT-A-NAME"} }, "-hosted-key-envs"},
		{"mesh listener without identity", func(c *Config) { c.MeshListen = "127.0.0.1:0" }, "-mesh-listen"},
		{"mesh engines without identity", func(c *Config) { c.MeshEngines = true }, "-mesh-engines"},
		{"no listener at all", func(c *Config) { c.Listen = ListenOff }, "-listen"},
		{"mesh identity, no listener", func(c *Config) { c.Listen, c.MeshService = ListenOff, "oasis-router" }, "-listen"},
		{"mesh listener without port", func(c *Config) { c.MeshService, c.MeshListen = "oasis-router", "127.0.0.1" }, "-mesh-listen"},
		{"mesh engines with static discovery", func(c *Config) { c.MeshService, c.MeshEngines = "oasis-router", true }, "-mesh-engines"},
		{"register without listener", func(c *Config) {
			c.Listen, c.MeshService, c.MeshListen, c.Register = ListenOff, "oasis-router", "127.0.0.1:0", true
		}, "-register"},
		{"federation files in the mesh", func(c *Config) {
			c.MeshService, c.FederationListen, c.FederationTLSCert = "oasis-router", "127.0.0.1:0", pki.serverCert
		}, "-federation-tls-cert"},
		{"peers key without listener", func(c *Config) { c.PeersKeyFile = junk }, "-peers-listen"},
		{"peers listener without port", func(c *Config) { c.PeersListen = "127.0.0.1" }, "-peers-listen"},
		{"peers beyond loopback without key", func(c *Config) { c.PeersListen = "0.0.0.0:0" }, "-peers-listen"},
		{"peers key not base64", func(c *Config) { c.PeersListen, c.PeersKeyFile = "127.0.0.1:0", junk }, "-peers-key-file"},
		{"peers key of 5 bytes", func(c *Config) {
			c.PeersListen, c.PeersKeyFile = "127.0.0.1:0", write("short.key", "c2hvcnQ=")
		}, "-peers-key-file"},
		{"peers interval negative", func(c *Config) { c.PeersListen, c.PeersInterval = "127.0.0.1:0", -time.Second }, "-peers-interval"},
		{"peers interval over the bound", func(c *Config) { c.PeersListen, c.PeersInterval = "127.0.0.1:0", time.Minute }, "-peers-interval"},
		{"peers min interval over the interval", func(c *Config) {
			c.PeersListen, c.PeersInterval, c.PeersMinInterval = "127.0.0.1:0", 100*time.Millisecond, 200*time.Millisecond
		}, "-peers-min-interval"},
		{"mesh identity without Connect", func(c *Config) {
			c.MeshService, c.ConsulAddr = "oasis-router", "127.0.0.1:1" // no Consul there: no leaf
		}, "-mesh-service"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseConfig(t, "127.0.0.1:1")
			tc.edit(&cfg)
			a, err := New(cfg)
			if err == nil {
				a.Close()
			}
			var ce *ConfigError
			must.True(t, errors.As(err, &ce), must.Sprintf("got %v", err))
			must.Eq(t, tc.flag, ce.Flag, must.Sprint(err))
			must.StrContains(t, err.Error(), tc.flag)
		})
	}
}

// Run returns when its context ends, after the stream in flight finished:
// the client gets every event, and new connections are refused meanwhile.
func TestRunDrainsInFlightStream(t *testing.T) {
	const events = 10
	eng := newEngine(t, events, 50*time.Millisecond)
	r := start(t, baseConfig(t, eng.URL))

	resp := complete(t, http.DefaultClient, r.url("http"), true)
	must.Eq(t, http.StatusOK, resp.StatusCode)
	br := bufio.NewReader(resp.Body)
	first, err := br.ReadString('\n')
	must.NoError(t, err)
	must.Eq(t, wantEvents(events)[0]+"\n", first)

	r.cancel()
	testutil.Eventually(t, 10*time.Second, "the router to stop serving", func() bool {
		ready, err := http.Get(r.url("http") + "/ready")
		if err != nil {
			return true // the listener is closed
		}
		ready.Body.Close()
		return ready.StatusCode == http.StatusServiceUnavailable
	})
	select {
	case err := <-r.done:
		t.Fatalf("Run returned before the stream ended: %v", err)
	default:
	}
	rest := readEvents(t, br)
	must.Eq(t, wantEvents(events)[1:], rest)
	select {
	case err := <-r.done:
		must.NoError(t, err)
		r.done <- err // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the stream ended")
	}
	_, err = net.DialTimeout("tcp", r.Addr().String(), time.Second)
	must.Error(t, err)
}

// The routing decisions teach the router which prompts a worker without KV
// events holds: a prompt sent twice to a sim engine (oasis-sim's tokenizer,
// no /tokenize round trip) is matched in full the second time, and the
// oasis_router_prefix_* counters say so.
func TestDecisionsLearnPrefixes(t *testing.T) {
	eng := newEngine(t, 1, 0)
	cfg := baseConfig(t)
	cfg.Engines = []StaticEngine{{Model: "m", Address: strings.TrimPrefix(eng.URL, "http://"), Engine: "sim"}}
	cfg.PolicyFile = policyFile(t, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`)
	r := start(t, cfg)

	prompt := strings.Repeat("the same long system prompt shared by every request ", 40)
	for range 2 {
		completePrompt(t, r.url("http"), "m", prompt)
	}
	requested, matched := prefixBlocks(t, cfg.Registry, "m")
	must.Greater(t, 0, requested)
	must.Eq(t, requested/2, matched) // nothing the first time, everything the second
}

// completePrompt posts one completion of prompt through the router at url.
func completePrompt(t *testing.T, url, model, prompt string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q}`, model, prompt)
	resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
}

// prefixBlocks reads the oasis_router_prefix_* counters of model.
func prefixBlocks(t *testing.T, reg *prometheus.Registry, model string) (requested, matched float64) {
	t.Helper()
	mfs, err := reg.Gather()
	must.NoError(t, err)
	for _, mf := range mfs {
		var sum *float64
		switch mf.GetName() {
		case "oasis_router_prefix_request_blocks_total":
			sum = &requested
		case "oasis_router_prefix_matched_blocks_total":
			sum = &matched
		default:
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == model { // the only label
				*sum += m.GetCounter().GetValue()
			}
		}
	}
	return requested, matched
}

// An engine without KV events that advertises its offload tiers in
// oasis_kv_capacity (registered in a real Consul) is modelled with them:
// prompts pushed out of its small GPU tier by newer ones still match from
// the CPU tier, where an engine advertising the same GPU tier alone has
// forgotten them.
func TestDecisionsModelAdvertisedTiers(t *testing.T) {
	consul, addr := testutil.StartConsul(t)
	eng := newEngine(t, 1, 0)
	host, port, err := net.SplitHostPort(strings.TrimPrefix(eng.URL, "http://"))
	must.NoError(t, err)
	p, err := strconv.Atoi(port)
	must.NoError(t, err)
	for id, capacity := range map[string]string{"tiered": "gpu=64,cpu=65536", "gpu-only": "gpu=64"} {
		must.NoError(t, consul.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: id, Name: discovery.EngineService, Address: host, Port: p,
			Meta: map[string]string{"oasis_model": id, "oasis_engine": "sim", "oasis_kv_capacity": capacity}}))
	}
	cfg := baseConfig(t)
	cfg.Discovery, cfg.ConsulAddr = DiscoveryConsul, addr
	cfg.PolicyFile = policyFile(t, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`)
	r := start(t, cfg)
	testutil.Eventually(t, 10*time.Second, "both registrations in the pool", func() bool {
		return len(r.Pool().Workers("tiered")) == 1 && len(r.Pool().Workers("gpu-only")) == 1
	})

	first := strings.Repeat("a first long prompt that the engine computes once ", 40)
	second := strings.Repeat("then a second one, as long, which pushes it out of the GPU ", 40)
	for _, model := range []string{"tiered", "gpu-only"} {
		completePrompt(t, r.url("http"), model, first)
		completePrompt(t, r.url("http"), model, second)
		before, matchedBefore := prefixBlocks(t, cfg.Registry, model)
		completePrompt(t, r.url("http"), model, first)
		after, matched := prefixBlocks(t, cfg.Registry, model)
		must.Greater(t, 4, after-before, must.Sprintf("%s: the prompt spans more blocks than the GPU tier", model))
		if model == "tiered" {
			must.Eq(t, after-before, matched-matchedBefore, must.Sprintf("%s: the whole first prompt is still held", model))
		} else {
			must.Eq(t, 0.0, matched-matchedBefore, must.Sprintf("%s: nothing of the first prompt is left", model))
		}
	}
}
