// Package router runs oasis-router end to end on the real Nomad + Consul test
// bed: three oasis-sim engines run by the llm driver, registered in Consul by
// their jobs' service blocks, and the oasis-router binary in front of them.
package router

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

// The sim recipe's artifact test runs the oasis-sim its job downloaded: the llm driver allows a
// task's own binary only with allow_task_binary.
func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Options{LLMPluginExtra: "allow_task_binary = true"}, &stack))
}

// engineJob is one oasis-sim engine run by the llm driver, registered as
// oasis-engine with the Oasis meta convention.
func engineJob(id string) string {
	return testbed.SimEngine{ID: id}.HCL()
}

// routerProc is the oasis-router binary under test.
type routerProc struct {
	url    string
	key    string
	client *http.Client // plain, or trusting the router's test CA
	cmd    *exec.Cmd
	done   chan struct{}
	log    string
}

func startRouter(t *testing.T, prefix string, extra ...string) *routerProc {
	return startRouterWith(t, prefix, "http", http.DefaultClient, extra...)
}

// startRouterTLS runs the router with a certificate for 127.0.0.1 from a
// test CA, and a client that trusts that CA and negotiates HTTP/2.
func startRouterTLS(t *testing.T, prefix string) *routerProc {
	t.Helper()
	ca := tlsfilestest.NewCA(t, "oasis-e2e-ca")
	leaf := ca.Issue(t, "oasis-router", "127.0.0.1")
	dir := t.TempDir()
	cert := tlsfilestest.WriteFile(t, dir, "router.crt", leaf.CertPEM)
	key := tlsfilestest.WriteFile(t, dir, "router.key", leaf.KeyPEM)
	client := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true,
		TLSClientConfig: &tls.Config{RootCAs: tlsfilestest.Pool(ca), MinVersion: tls.VersionTLS12}}}
	t.Cleanup(client.CloseIdleConnections)
	return startRouterWith(t, prefix, "https", client, "-tls-cert", cert, "-tls-key", key)
}

func startRouterWith(t *testing.T, prefix, scheme string, client *http.Client, extra ...string) *routerProc {
	t.Helper()
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	r := &routerProc{url: scheme + "://127.0.0.1:" + strconv.Itoa(ports[0]), key: prefix + "/policy", client: client,
		done: make(chan struct{}), log: filepath.Join(t.TempDir(), "router.log")}
	logf, err := os.Create(r.log)
	must.NoError(t, err)
	args := append([]string{"-listen", "127.0.0.1:" + strconv.Itoa(ports[0]),
		"-consul-addr", stack.ConsulAddr, "-kv-prefix", prefix, "-scrape-interval", "500ms", "-register"}, extra...)
	r.cmd = exec.Command(stack.Bin("oasis-router"), args...)
	// The management tokens: each test has a KV prefix of its own, outside the oasis-router
	// role's. The role itself is what TestJobSecretsStayOutOfNomadAndConsul runs the job with.
	r.cmd.Env = stack.Env()
	r.cmd.Stdout, r.cmd.Stderr = logf, logf
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	must.NoError(t, r.cmd.Start())
	go func() { _ = r.cmd.Wait(); logf.Close(); close(r.done) }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-r.done:
		case <-time.After(10 * time.Second):
			_ = r.cmd.Process.Kill()
			<-r.done
		}
		if t.Failed() {
			out, _ := os.ReadFile(r.log)
			t.Logf("router log:\n%s", out)
		}
	})
	testutil.EventuallyEvery(t, 20*time.Second, 50*time.Millisecond, "the router's /health to answer 200", func() bool {
		resp, err := r.client.Get(r.url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return r
}

// metrics scrapes the router's /metrics: family → label-set string → value.
func (r *routerProc) metrics(t *testing.T) map[string]map[string]float64 {
	t.Helper()
	resp, err := r.client.Get(r.url + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	must.NoError(t, err)
	out := map[string]map[string]float64{}
	for name, f := range fams {
		out[name] = map[string]float64{}
		for _, m := range f.Metric {
			var parts []string
			for _, l := range m.Label {
				parts = append(parts, l.GetName()+"="+l.GetValue())
			}
			v := 0.0
			switch {
			case m.Counter != nil:
				v = m.Counter.GetValue()
			case m.Gauge != nil:
				v = m.Gauge.GetValue()
			}
			out[name][strings.Join(parts, ",")] = v
		}
	}
	return out
}

// servedBy returns successful requests per worker id.
func (r *routerProc) servedBy(t *testing.T) map[string]float64 {
	out := map[string]float64{}
	for labels, v := range r.metrics(t)["oasis_router_requests_total"] {
		if !strings.Contains(labels, "status=200") {
			continue
		}
		for _, p := range strings.Split(labels, ",") {
			if w, ok := strings.CutPrefix(p, "worker="); ok {
				out[w] += v
			}
		}
	}
	return out
}

func (r *routerProc) putPolicy(t *testing.T, doc string) {
	t.Helper()
	_, err := stack.Consul.KV().Put(&consulapi.KVPair{Key: r.key, Value: []byte(doc)}, nil)
	must.NoError(t, err)
}

func chat(url string, maxTokens int, model ...string) (status int, events int, err error) {
	status, events, _, err = chatWith(http.DefaultClient, url, maxTokens, model...)
	return status, events, err
}

// chatWith streams a chat completion and counts its events. A stream that
// ends with an error event, or without [DONE], is an error.
func chatWith(client *http.Client, url string, maxTokens int, model ...string) (status int, events int, proto string, err error) {
	m := "llama"
	if len(model) > 0 {
		m = model[0]
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"tell me a story"}],"max_tokens":%d,"stream":true}`, m, maxTokens)
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, 0, "", err
	}
	defer resp.Body.Close()
	status, events, err = readStream(resp)
	return status, events, resp.Proto, err
}

func readStream(resp *http.Response) (status int, events int, err error) {
	br := bufio.NewReader(resp.Body)
	done := false
	for {
		line, rerr := br.ReadString('\n')
		if strings.HasPrefix(line, `data: {"error"`) {
			return resp.StatusCode, events, fmt.Errorf("error event: %s", strings.TrimSpace(line))
		}
		if strings.HasPrefix(line, "data: {") {
			events++
		}
		if strings.HasPrefix(line, "data: [DONE]") {
			done = true
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return resp.StatusCode, events, rerr
		}
	}
	if resp.StatusCode == 200 && !done {
		return resp.StatusCode, events, fmt.Errorf("stream ended without [DONE]")
	}
	return resp.StatusCode, events, nil
}

func TestRouterOnTestbed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	jobs := []string{"sim-a", "sim-b", "sim-c"}
	for _, j := range jobs {
		_, err := stack.RunJobHCL(ctx, engineJob(j))
		must.NoError(t, err)
		t.Cleanup(func() { _ = stack.StopJob(context.Background(), j) })
	}
	for _, j := range jobs {
		_, err := stack.WaitAllocsRunning(ctx, j)
		must.NoError(t, err)
	}
	r := startRouter(t, "oasis-e2e/router")
	r.putPolicy(t, `{"policy":"round_robin"}`)

	// The router registered itself and sees three passing engines.
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "the router to see three llama workers", func() bool {
		return r.metrics(t)["oasis_router_workers"]["model=llama"] == 3
	})
	// Registered as oasis-router; passing once Consul's HTTP check has run.
	testutil.EventuallyEvery(t, 20*time.Second, 200*time.Millisecond, "a passing oasis-router instance in Consul", func() bool {
		svcs, _, err := stack.Consul.Health().Service("oasis-router", "", true, nil)
		return err == nil && len(svcs) == 1
	})
	testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the router's first policy reload", func() bool {
		return r.metrics(t)["oasis_router_policy_reloads_total"][""] >= 1
	})

	t.Run("requests spread as the policy says", func(t *testing.T) {
		before := r.servedBy(t)
		for range 30 {
			code, _, err := chat(r.url, 4)
			must.NoError(t, err)
			must.Eq(t, 200, code)
		}
		after := r.servedBy(t)
		must.MapLen(t, 3, after)
		for w, n := range after {
			must.Eq(t, 10.0, n-before[w], must.Sprintf("worker %s", w))
		}
	})

	t.Run("a bad policy document changes nothing", func(t *testing.T) {
		rejects := r.metrics(t)["oasis_router_policy_rejects_total"][""]
		r.putPolicy(t, `{"policy":"weighted","weights":{"no_such_term":1}}`)
		testutil.EventuallyEvery(t, 10*time.Second, 50*time.Millisecond, "the bad policy's rejection to be counted", func() bool {
			return r.metrics(t)["oasis_router_policy_rejects_total"][""] == rejects+1
		})
		before := r.servedBy(t)
		for range 30 {
			code, _, err := chat(r.url, 4)
			must.NoError(t, err)
			must.Eq(t, 200, code)
		}
		after := r.servedBy(t)
		for w, n := range after {
			must.Eq(t, 10.0, n-before[w], must.Sprintf("worker %s still round robin", w))
		}
	})

	t.Run("over TLS and HTTP/2", func(t *testing.T) {
		tr := startRouterTLS(t, "oasis-e2e/router-tls")
		tr.putPolicy(t, `{"policy":"round_robin"}`)
		testutil.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "the TLS router to see three llama workers", func() bool {
			return tr.metrics(t)["oasis_router_workers"]["model=llama"] == 3
		})
		for range 9 {
			code, events, proto, err := chatWith(tr.client, tr.url, 4)
			must.NoError(t, err)
			must.Eq(t, 200, code)
			must.Eq(t, "HTTP/2.0", proto)
			must.Positive(t, events)
		}
		// The same router speaks HTTP/1.1 over TLS to clients without HTTP/2.
		cfg := tr.client.Transport.(*http.Transport).TLSClientConfig.Clone()
		cfg.NextProtos = []string{"http/1.1"}
		h1 := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		code, _, proto, err := chatWith(h1, tr.url, 4)
		must.NoError(t, err)
		must.Eq(t, 200, code)
		must.Eq(t, "HTTP/1.1", proto)
		// Plain HTTP to the TLS listener gets no completion.
		resp, err := http.Post(strings.Replace(tr.url, "https://", "http://", 1)+"/v1/chat/completions", "application/json",
			strings.NewReader(`{"model":"llama"}`))
		if err == nil {
			resp.Body.Close()
			must.Eq(t, http.StatusBadRequest, resp.StatusCode)
		}
	})

	t.Run("an engine stopped mid-run costs no request that had not started streaming", func(t *testing.T) {
		r.putPolicy(t, `{"policy":"least_load"}`)
		var (
			okN, brokenAfterStart, lostBeforeStart atomic.Int64
			wg                                     sync.WaitGroup
			stop                                   atomic.Bool
			firstErr                               atomic.Value
		)
		for range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					code, events, err := chat(r.url, 24)
					switch {
					case err == nil && code == 200:
						okN.Add(1)
					case events > 0:
						brokenAfterStart.Add(1) // allowed: bytes were already streamed
					default:
						lostBeforeStart.Add(1)
						firstErr.CompareAndSwap(nil, fmt.Sprintf("status %d: %v", code, err))
					}
				}
			}()
		}
		finished := func() int64 { return okN.Load() + brokenAfterStart.Load() + lostBeforeStart.Load() }
		testutil.Eventually(t, 60*time.Second, "the load's first 3 requests per client", func() bool { return finished() >= 3*6 })
		must.NoError(t, stack.StopJob(ctx, "sim-b"))
		// Requests that started after the stop, 3 per client, have finished.
		atStop := finished()
		testutil.Eventually(t, 60*time.Second, "3 more requests per client after the stop", func() bool { return finished() >= atStop+4*6 })
		stop.Store(true)
		wg.Wait()
		t.Logf("ok=%d broken-after-first-byte=%d lost-before-first-byte=%d retries=%v", okN.Load(), brokenAfterStart.Load(),
			lostBeforeStart.Load(), r.metrics(t)["oasis_router_retries_total"])
		must.Eq(t, int64(0), lostBeforeStart.Load(), must.Sprintf("first failure: %v", firstErr.Load()))
		must.Greater(t, 20, okN.Load())
		must.Eq(t, 2.0, r.metrics(t)["oasis_router_workers"]["model=llama"])
	})
}
