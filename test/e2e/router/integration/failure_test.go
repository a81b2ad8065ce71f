package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// These tests kill (SIGKILL) or freeze (SIGSTOP) a real oasis-sim behind the
// router, as an engine crash or a hung GPU would, and check what the client
// sees: a retry on another worker while nothing was sent, an SSE error event
// and a proper end of the stream after.

// setPolicy stores doc as the router's policy and waits until it applies.
func (r *router) setPolicy(t *testing.T, c *consulapi.Client, doc string) {
	t.Helper()
	_, err := c.KV().Put(&consulapi.KVPair{Key: r.key, Value: []byte(doc)}, nil)
	must.NoError(t, err)
	p, _, err := c.KV().Get(r.key, nil)
	must.NoError(t, err)
	testutil.EventuallyEvery(t, 10*time.Second, 5*time.Millisecond, "the watcher to apply the policy's current index", func() bool { return r.watcher.AppliedIndex() == p.ModifyIndex })
}

// signal sends sig to the sim's process; a stopped sim is continued when the
// test ends so that it can be killed.
func (s *sim) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	must.NoError(t, syscall.Kill(s.Pid(), sig))
	if sig == syscall.SIGSTOP {
		t.Cleanup(func() { _ = syscall.Kill(s.Pid(), syscall.SIGCONT) })
	}
}

// streamChat sends a streaming chat request and returns the response.
func streamChat(t *testing.T, url, model string, maxTokens int) *http.Response {
	t.Helper()
	body := `{"model":"` + model + `","messages":[{"role":"user","content":"` + strings.Repeat("tell me a long story ", 10) +
		`"}],"max_tokens":` + strconv.Itoa(maxTokens) + `,"stream":true}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	must.NoError(t, err)
	return resp
}

// sseEvents reads a whole event stream: its data payloads in order. The
// body must end properly (no read error).
func sseEvents(t *testing.T, resp *http.Response) []string {
	t.Helper()
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			out = append(out, d)
		}
	}
	must.NoError(t, sc.Err(), must.Sprint("the stream must end properly"))
	return out
}

// twoSims registers a slow-prefilling sim (chosen first by round robin) and
// a normal one for model, behind a round-robin router with short timeouts.
func twoSims(t *testing.T, model string, slowArgs ...string) (*router, *sim, *sim) {
	c := consul.client
	r := newRouter(t, c)
	slow := startSim(t, model, slowArgs...)
	fast := startSim(t, model)
	r.register(t, c, "a-"+model, model, slow)
	r.register(t, c, "b-"+model, model, fast)
	r.setPolicy(t, c, `{"policy":"round_robin","timeouts":{"stream_idle":"1s","first_token_hold":"auto"}}`)
	r.waitPool(t, model, "a-"+model, "b-"+model)
	return r, slow, fast
}

func TestEngineFailsBeforeFirstToken(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGKILL, syscall.SIGSTOP} {
		t.Run(sig.String(), func(t *testing.T) {
			model := "fail-prefill-" + strconv.Itoa(int(sig))
			// Prefill takes seconds on the slow sim: the signal lands during it.
			r, slow, _ := twoSims(t, model, "--speed", "1", "--step-time-per-prefill-token", "40ms")
			done := make(chan *http.Response, 1)
			go func() { done <- streamChat(t, r.url, model, 4) }()
			testutil.Eventually(t, 10*time.Second, "the request in flight to the slow sim", func() bool {
				return promtest.ToFloat64(r.m.WorkerInFlight.WithLabelValues(model, "a-"+model)) == 1
			})
			slow.signal(t, sig)
			var resp *http.Response
			select {
			case resp = <-done:
			case <-time.After(20 * time.Second):
				t.Fatal("no answer after the engine failed")
			}
			must.Eq(t, http.StatusOK, resp.StatusCode)
			events := sseEvents(t, resp)
			must.Eq(t, "[DONE]", events[len(events)-1])
			for _, e := range events {
				must.StrNotContains(t, e, `"error"`)
			}
			must.Eq(t, 1.0, promtest.ToFloat64(r.m.Retries.WithLabelValues(model)))
		})
	}
}

// TestEngineFailsMidStream kills or stops the engine of a stream after its
// first token reached the client. With migration (the default
// migration_limit) the stream goes on on the other engine: no error event,
// [DONE], counted as a migration, never as a retry. With migration_limit 0
// it ends with the error event as before migration.
func TestEngineFailsMidStream(t *testing.T) {
	cases := []struct {
		sig          syscall.Signal
		code, reason string
	}{{syscall.SIGKILL, "upstream_error", "engine_failed"}, {syscall.SIGSTOP, "upstream_timeout", "stream_idle"}}
	for _, tc := range cases {
		for _, migrate := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/migrate=%t", tc.sig, migrate), func(t *testing.T) {
				model := fmt.Sprintf("fail-decode-%d-%t", int(tc.sig), migrate)
				r, slow, _ := twoSims(t, model, "--speed", "1", "--step-time-base", "100ms")
				if !migrate {
					r.setPolicy(t, consul.client, `{"policy":"round_robin","timeouts":{"stream_idle":"1s","first_token_hold":"auto"},"migration_limit":0}`)
				}
				resp := streamChat(t, r.url, model, 50)
				must.Eq(t, http.StatusOK, resp.StatusCode)
				br := bufio.NewReader(resp.Body)
				for {
					line, err := br.ReadString('\n')
					must.NoError(t, err)
					if strings.Contains(line, `"content":"`) && !strings.Contains(line, `"content":""`) {
						break // a token reached the client
					}
				}
				slow.signal(t, tc.sig)
				resp.Body = io.NopCloser(br)
				events := sseEvents(t, resp)
				must.Eq(t, "[DONE]", events[len(events)-1])
				must.Eq(t, 0.0, promtest.ToFloat64(r.m.Retries.WithLabelValues(model)))
				if migrate {
					for _, e := range events {
						must.StrNotContains(t, e, `"error"`)
					}
					must.Eq(t, 1.0, promtest.ToFloat64(r.m.Migrations.WithLabelValues(model, tc.reason)))
					return
				}
				must.GreaterEq(t, 2, len(events)) // ..., the error, [DONE]
				var e struct {
					Error struct{ Code, Type, Message string } `json:"error"`
				}
				must.NoError(t, json.Unmarshal([]byte(events[len(events)-2]), &e))
				must.Eq(t, tc.code, e.Error.Code)
				must.Eq(t, "server_error", e.Error.Type)
			})
		}
	}
}

// TestConsulDownAtStartup runs the oasis-router binary against a Consul
// address nothing listens on: requests get 503 with Retry-After (the model
// may exist; discovery has not answered), never 404. Then a Consul client
// agent starts on that very address, joined to a server with which an
// engine registered, as a node's agent coming back would: the router serves
// the model within 10 s of the agent reaching the servers (asserted; its
// discovery retries at least every 5 s, router/discovery's longest backoff).
//
// What is lost: every request sent while Consul was away, each a 503 with
// Retry-After (asserted: none is a 404, a connection error or anything
// else), and none once the model has been served.
func TestConsulDownAtStartup(t *testing.T) {
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	pol := filepath.Join(t.TempDir(), "policy.json")
	must.NoError(t, os.WriteFile(pol, []byte(`{"policy":"round_robin"}`), 0o644))
	url := startRouterBin(t, "127.0.0.1:"+strconv.Itoa(ports[0]), "-policy-file", pol, "-kvcached-service", "")
	code, body := chat(t, url, "any-model", false)
	must.Eq(t, http.StatusServiceUnavailable, code)
	must.StrContains(t, body, `"code":"no_healthy_worker"`)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(`{"model":"any-model"}`))
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, "1", resp.Header.Get("Retry-After"))

	// The engine registers with a server while the router's agent is away.
	cluster := testutil.StartConsulCluster(t, 1)
	register(t, cluster.Servers[0].Client, "late-1", "late", startSim(t, "late"))
	l := startLoad(url, "late", 1)
	started := time.Now()
	testutil.StartConsulClient(t, cluster, "router-node", ports[0])
	back := time.Now()
	var served time.Time
	testutil.Eventually(t, 20*time.Second, "the router to serve the model", func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, r := range l.results {
			if r.ok() {
				served = r.end
				return true
			}
		}
		return false
	})
	for range 10 {
		r := send(url, "late", true)
		must.True(t, r.ok(), must.Sprintf("served after recovery: %d %s", r.status, r.problem))
	}
	results := l.finish()
	sum := summarize(results)
	var lostAfter int
	for _, r := range results {
		if !r.ok() && r.start.After(served) {
			lostAfter++
		}
	}
	t.Logf("agent up %v after it started; model served %v after the agent reached the servers; %d requests: %d ok, %d lost (503 with Retry-After), %d failed",
		back.Sub(started), served.Sub(back), len(results), sum.ok, sum.unavailable, len(sum.failed))
	must.SliceEmpty(t, sum.failed, must.Sprint("every request succeeds or gets 503 with Retry-After"))
	must.Zero(t, lostAfter, must.Sprint("no request is lost once the model has been served"))
	must.Less(t, 10*time.Second, served.Sub(back), must.Sprint("the pool recovers within 10 s of Consul coming back"))
}
