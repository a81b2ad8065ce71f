package federation

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/app"
)

const model = "sim-model"

// policy: federation on; one request in flight per datacenter and no queue,
// so that one long request saturates a datacenter.
const policyDoc = `{"policy":"round_robin","admission":{"max_in_flight":1,"max_queue":0},
  "federation":{"enabled":true,"max_spill_fraction":1,"resume_spill_fraction":0.5}}`

// dc is one datacenter: its Consul agent, engines and router.
type dc struct {
	name   string
	consul *testutil.ConsulAgent
	sims   []*testutil.Sim
	url    string
	reg    *prometheus.Registry
	fed    string // its federation listener, host:port
}

func startDC(t *testing.T, name string, agent *testutil.ConsulAgent, ca *tlsfilestest.CA) *dc {
	t.Helper()
	return startDCWith(t, name, agent, ca, dcOpts{engines: 1})
}

// dcOpts varies a datacenter from startDC's.
type dcOpts struct {
	policy    string   // the policy document; "": policyDoc
	engines   int      // local oasis-sim engines (startDC: 1)
	simArgs   []string // the sims' extra flags
	listen    string   // the federation listener; "": a free address
	advertise string   // the address registered for peers; "": the listener's
	hosts     []string // certificate addresses besides 127.0.0.1
	// mesh: the router's identity, on the federation link too, is its
	// Connect leaf (service oasis-router), not the CA's files.
	mesh bool
}

func startDCWith(t *testing.T, name string, agent *testutil.ConsulAgent, ca *tlsfilestest.CA, o dcOpts) *dc {
	t.Helper()
	d := &dc{name: name, consul: agent, reg: prometheus.NewRegistry()}
	for i := range o.engines {
		args := append([]string{"--log-level", "warn"}, o.simArgs...)
		sim := testutil.StartSim(t, testutil.SimConfig{Bin: simBin, Model: model, Args: args})
		d.sims = append(d.sims, sim)
		registerEngine(t, agent.Client, name+"-engine-"+strconv.Itoa(i), sim.Addr)
	}
	if o.policy == "" {
		o.policy = policyDoc
	}
	if o.listen == "" {
		o.listen = testutil.FreeAddr(t)
	}
	d.fed = o.listen
	dir := t.TempDir()
	caFile, cert, key := ca.WriteRouterFiles(t, dir, name, append([]string{"127.0.0.1"}, o.hosts...)...)
	pol := filepath.Join(dir, "policy.json")
	must.NoError(t, os.WriteFile(pol, []byte(o.policy), 0o600))
	listen := testutil.FreeAddr(t)
	d.url = "http://" + listen
	cfg := app.Config{Listen: listen, Discovery: app.DiscoveryConsul, ConsulAddr: agent.HTTPAddr, PolicyFile: pol,
		Register: true, FederationListen: o.listen, FederationAdvertise: o.advertise, FederationDC: name,
		FederationTLSCert: cert, FederationTLSKey: key, FederationTLSCA: caFile, ScrapeInterval: time.Second,
		ShutdownTimeout: 5 * time.Second, Registry: d.reg,
		Logger: hclog.New(&hclog.LoggerOptions{Name: "router-" + name, Level: hclog.Warn, Output: testWriter{t}})}
	if o.mesh {
		cfg.FederationTLSCert, cfg.FederationTLSKey, cfg.FederationTLSCA, cfg.MeshService = "", "", "", "oasis-router"
	}
	a, err := app.New(cfg)
	must.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return d
}

// testWriter sends router logs to the test's log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// registerEngine registers a sim as an oasis-engine instance with an HTTP
// check on its /health every second: a stopped engine leaves the pool.
func registerEngine(t *testing.T, c *consulapi.Client, id, addr string) {
	t.Helper()
	host, portS, _ := net.SplitHostPort(addr)
	port, _ := strconv.Atoi(portS)
	must.NoError(t, c.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: id, Name: "oasis-engine", Address: host, Port: port,
		Meta: map[string]string{"oasis_model": model, "oasis_engine": "sim", "oasis_role": "both", "oasis_block_size": "16"},
		Check: &consulapi.AgentServiceCheck{HTTP: "http://" + addr + "/health", Interval: "1s", Timeout: "1s",
			Status: consulapi.HealthPassing},
	}))
}

// metric sums a counter or gauge's series whose labels include want.
func (d *dc) metric(t *testing.T, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := d.reg.Gather()
	must.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for k, v := range want {
				if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == k && l.GetValue() == v }) {
					continue next
				}
			}
			sum += m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return sum
}

// chat sends a streaming chat request; maxTokens sets its length.
func (d *dc) chat(t *testing.T, maxTokens int) (*http.Response, string) {
	t.Helper()
	return d.chatPrompt(t, "hello federation", maxTokens)
}

// chatBody is a streaming chat request's body.
func chatBody(prompt string, maxTokens int) string {
	content, _ := json.Marshal(prompt)
	return `{"model":"` + model + `","messages":[{"role":"user","content":` + string(content) + `}],` +
		`"stream":true,"stream_options":{"include_usage":true},"max_tokens":` + strconv.Itoa(maxTokens) + `}`
}

// chatPrompt sends a streaming chat request with prompt as the user's message.
func (d *dc) chatPrompt(t *testing.T, prompt string, maxTokens int) (*http.Response, string) {
	t.Helper()
	resp, err := http.Post(d.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody(prompt, maxTokens)))
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return resp, string(b)
}

// checkStream asserts an intact OpenAI event stream: every event is JSON
// or [DONE], tokens arrived, a usage object came through, and it ends with
// [DONE] and no error event.
func checkStream(t *testing.T, body string) {
	t.Helper()
	var tokens, usage int
	var last string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		last = line
		if line == "[DONE]" {
			continue
		}
		var ev struct {
			Error   *json.RawMessage `json:"error"`
			Choices []struct {
				Delta struct{ Content string } `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		must.NoError(t, json.Unmarshal([]byte(line), &ev), must.Sprintf("event %q", line))
		must.Nil(t, ev.Error, must.Sprintf("error event in %q", body))
		if len(ev.Choices) > 0 && ev.Choices[0].Delta.Content != "" {
			tokens++
		}
		if ev.Usage != nil && ev.Usage.CompletionTokens > 0 {
			usage++
		}
	}
	must.Eq(t, "[DONE]", last)
	must.Positive(t, tokens)
	must.Eq(t, 1, usage, must.Sprint("one usage object passed through"))
}

// waitSummaries waits until d has accepted n more summaries from the
// routers of datacenter from: the evidence that one built after what the
// caller just did has arrived.
func (d *dc) waitSummaries(t *testing.T, from string, n float64) {
	t.Helper()
	testutil.Eventually(t, 30*time.Second, fmt.Sprintf("%v more summaries from %s", n, from), d.summariesSince(t, from, n))
}

// summariesSince returns a condition: d has accepted n more summaries from
// the routers of datacenter from than when it was made.
func (d *dc) summariesSince(t *testing.T, from string, n float64) func() bool {
	t.Helper()
	const name = "oasis_router_federation_summaries_received_total"
	before := d.metric(t, name, map[string]string{"dc": from})
	return func() bool { return d.metric(t, name, map[string]string{"dc": from}) >= before+n }
}

func TestFederation(t *testing.T) {
	c1, c2 := testutil.StartConsulWAN(t)
	ca := tlsfilestest.NewCA(t, "federation")
	dc1, dc2 := startDC(t, "dc1", c1, ca), startDC(t, "dc2", c2, ca)
	// Each router finds the other through Consul and receives its summaries.
	for _, d := range []*dc{dc1, dc2} {
		testutil.Eventually(t, 30*time.Second, d.name+" to receive a summary", func() bool {
			return d.metric(t, "oasis_router_federation_summary_age_seconds", nil) > 0
		})
	}
	fwd := func(d *dc) float64 { return d.metric(t, "oasis_router_federation_forwarded_total", nil) }

	t.Run("local first", func(t *testing.T) {
		for range 10 {
			resp, body := dc1.chat(t, 8)
			must.Eq(t, http.StatusOK, resp.StatusCode)
			checkStream(t, body)
		}
		must.Eq(t, 0.0, fwd(dc1))
		must.Eq(t, 0.0, fwd(dc2))
	})

	t.Run("both saturated: one hop at most", func(t *testing.T) {
		// A long request fills each datacenter's single slot, long enough to outlast two summaries.
		long := make(chan int, 2)
		for _, d := range []*dc{dc1, dc2} {
			go func() { resp, _ := d.chat(t, 800); long <- resp.StatusCode }()
		}
		testutil.Eventually(t, 10*time.Second, "both slots taken", func() bool {
			return dc1.metric(t, "oasis_router_worker_in_flight", nil) >= 1 &&
				dc2.metric(t, "oasis_router_worker_in_flight", nil) >= 1
		})
		// Summaries built since say no free slot.
		from2, from1 := dc1.summariesSince(t, "dc2", 2), dc2.summariesSince(t, "dc1", 2)
		testutil.Eventually(t, 30*time.Second, "two more summaries each way", func() bool { return from2() && from1() })
		before1, before2 := fwd(dc1), fwd(dc2)
		resp, _ := dc1.chat(t, 8)
		must.Eq(t, http.StatusTooManyRequests, resp.StatusCode)
		must.Eq(t, before2, fwd(dc2), must.Sprint("dc2 never forwards"))
		must.LessEq(t, before1+1, fwd(dc1))
		for range 2 {
			must.Eq(t, http.StatusOK, <-long)
		}
	})

	t.Run("dc2 Consul frozen", func(t *testing.T) {
		lat := func() time.Duration {
			var ds []time.Duration
			for range 10 {
				t0 := time.Now()
				resp, _ := dc1.chat(t, 4)
				must.Eq(t, http.StatusOK, resp.StatusCode)
				ds = append(ds, time.Since(t0))
			}
			slices.Sort(ds)
			return ds[len(ds)/2]
		}
		before := lat()
		must.NoError(t, syscall.Kill(dc2.consul.Pid(), syscall.SIGSTOP))
		frozen := time.Now()
		defer func() { _ = syscall.Kill(dc2.consul.Pid(), syscall.SIGCONT) }()
		during := lat()
		t.Logf("dc1 local p50 before %v, with dc2's Consul frozen %v", before, during)
		must.Less(t, before*2+20*time.Millisecond, during)
		// Blocking query wait (5 s) + the cross-DC timeout (2 s), and slack.
		testutil.Eventually(t, 12*time.Second, "dc2 marked stale", func() bool {
			return dc1.metric(t, "oasis_router_federation_peers_stale", map[string]string{"dc": "dc2"}) == 1
		})
		t.Logf("dc2 marked stale %v after the freeze", time.Since(frozen).Round(100*time.Millisecond))
		must.NoError(t, syscall.Kill(dc2.consul.Pid(), syscall.SIGCONT))
		testutil.Eventually(t, 20*time.Second, "dc2 fresh again", func() bool {
			return dc1.metric(t, "oasis_router_federation_peers_stale", map[string]string{"dc": "dc2"}) == 0
		})
	})

	t.Run("dc1 engines stopped: served by dc2", func(t *testing.T) {
		for _, s := range dc1.sims {
			_ = s.Stop()
		}
		testutil.Eventually(t, 15*time.Second, "dc1's pool to empty", func() bool {
			resp, err := http.Get(dc1.url + "/ready")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == http.StatusServiceUnavailable
		})
		before := dc1.metric(t, "oasis_router_federation_forwarded_total", map[string]string{"dc": "dc2", "reason": "no_local_worker"})
		resp, body := dc1.chat(t, 16)
		must.Eq(t, http.StatusOK, resp.StatusCode, must.Sprint(body))
		must.Eq(t, "text/event-stream", strings.Split(resp.Header.Get("Content-Type"), ";")[0])
		checkStream(t, body)
		must.Eq(t, before+1, dc1.metric(t, "oasis_router_federation_forwarded_total",
			map[string]string{"dc": "dc2", "reason": "no_local_worker"}))
	})
}
