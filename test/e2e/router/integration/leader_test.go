package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// TestConsulLeaderLost kills (SIGKILL) the leader of a 3-server Consul
// cluster while four clients, two of them streaming, send requests through
// the oasis-router binary. The router talks to Consul through a client agent
// with which the engines register, as on a production node.
//
// What is lost: no request. Every request succeeds, before, during and after
// the election: none gets a 404, a connection error or a broken stream
// (asserted), and none even gets the 503 with Retry-After the router answers
// when it has no engine for a known model (asserted to be 0: the engines
// never left, and the router keeps serving its last known pool while Consul
// has no leader). Requests are served while no leader exists (asserted).
// Once the new leader is elected, an engine registered for a new model is
// served, and its deregistration seen, each within 15 s (asserted; Consul
// holds a client's queries through an election and the router's discovery
// retries at least every 5 s).
func TestConsulLeaderLost(t *testing.T) {
	cluster := testutil.StartConsulCluster(t, 3)
	agent := testutil.StartConsulClient(t, cluster, "router-node", 0)
	c := agent.Client
	register(t, c, "e1", "alpha", startSim(t, "alpha"))
	register(t, c, "e2", "alpha", startSim(t, "alpha"))
	late := startSim(t, "beta") // started now: registered only after the election
	// The policy document in Consul KV, as in production: its watcher also
	// loses the leader.
	url := startRouterBin(t, agent.HTTPAddr)
	testutil.Eventually(t, 20*time.Second, "the router to serve alpha", func() bool {
		return send(url, "alpha", false).ok()
	})

	l := startLoad(url, "alpha", 4)
	l.waitMore(t, 20) // load running before the kill
	old := cluster.Leader()
	must.NotNil(t, old)
	killed := time.Now()
	must.NoError(t, old.Kill())
	leader := cluster.WaitLeader(t, 30*time.Second)
	elected := time.Now()
	t.Logf("leader %s killed; %s elected after %v", old.Name, leader.Name, elected.Sub(killed))

	register(t, c, "e3", "beta", late)
	registered := time.Now()
	testutil.Eventually(t, 15*time.Second, "the router to list beta", func() bool { return listed(t, url, "beta") })
	seen := time.Since(registered)
	code, _ := chat(t, url, "beta", false)
	must.Eq(t, http.StatusOK, code)
	must.NoError(t, c.Agent().ServiceDeregister("e3"))
	deregistered := time.Now()
	testutil.Eventually(t, 15*time.Second, "the router to drop beta", func() bool { return !listed(t, url, "beta") })
	gone := time.Since(deregistered)
	t.Logf("after the election: a registration served after %v, a deregistration seen after %v", seen, gone)
	l.waitMore(t, 20) // and still running after it
	results := l.finish()

	sum := summarize(results)
	var leaderless int
	for _, r := range results {
		if r.start.After(killed) && r.end.Before(elected) && r.ok() {
			leaderless++
		}
	}
	t.Logf("%d requests: %d ok, %d lost (503 with Retry-After), %d failed; %d served while Consul had no leader; router discovery errors: %s",
		len(results), sum.ok, sum.unavailable, len(sum.failed), leaderless, metric(t, url, "oasis_router_discovery_errors_total"))
	must.SliceEmpty(t, sum.failed, must.Sprint("every request succeeds or gets 503 with Retry-After"))
	must.Zero(t, sum.unavailable, must.Sprint("no request is lost: the router serves its last known pool"))
	must.Positive(t, leaderless, must.Sprint("requests are served while Consul has no leader"))
	must.Greater(t, 20, sum.ok, must.Sprint("the load ran"))
}

// startRouterBin runs the oasis-router binary against the Consul agent at
// consulAddr, with args added to its flags, and waits until it answers
// /health; it returns the router's URL.
func startRouterBin(t *testing.T, consulAddr string, args ...string) string {
	t.Helper()
	listen := testutil.FreeAddr(t)
	p := testutil.Start(t, exec.Command(routerBin, append([]string{"-listen", listen, "-consul-addr", consulAddr,
		"-log-level", "warn"}, args...)...))
	url := "http://" + listen
	testutil.Eventually(t, 20*time.Second, "the router to answer /health", func() bool {
		if p.Exited() {
			t.Fatalf("oasis-router exited: %v", p.Stop())
		}
		resp, err := http.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return url
}

// listed reports whether the router's /v1/models lists model.
func listed(t *testing.T, url, model string) bool {
	t.Helper()
	resp, err := http.Get(url + "/v1/models")
	must.NoError(t, err)
	defer resp.Body.Close()
	var list struct{ Data []struct{ ID string } }
	must.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	return slices.ContainsFunc(list.Data, func(m struct{ ID string }) bool { return m.ID == model })
}

// metric returns the value of an unlabelled metric on the router's /metrics
// ("" when absent).
func metric(t *testing.T, url, name string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return v
		}
	}
	return ""
}

// result is how one request ended.
type result struct {
	start, end time.Time
	status     int // 0: no response
	retryAfter string
	problem    string // why it failed: neither served nor a 503 with Retry-After
}

func (r result) ok() bool { return r.status == http.StatusOK && r.problem == "" }

// lost is a request the router refused as it should while it knows no
// engine for the model: a 503 with Retry-After.
func (r result) lost() bool {
	return r.status == http.StatusServiceUnavailable && r.retryAfter != "" && r.problem == ""
}

// loadClient bounds a request, so that a router that stops answering fails
// the request instead of hanging the test.
var loadClient = &http.Client{Timeout: 30 * time.Second}

// send sends one chat request for model, streamed or not, reads the whole
// answer, and says how it ended.
func send(url, model string, stream bool) result {
	r := result{start: time.Now()}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hello"}],"max_tokens":8,"stream":%v}`, model, stream)
	resp, err := loadClient.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		r.problem = err.Error()
		r.end = time.Now()
		return r
	}
	defer resp.Body.Close()
	r.status, r.retryAfter = resp.StatusCode, resp.Header.Get("Retry-After")
	b, err := io.ReadAll(resp.Body)
	switch {
	case err != nil:
		r.problem = fmt.Sprintf("%d, reading the body: %v", r.status, err)
	case r.status == http.StatusServiceUnavailable && r.retryAfter == "":
		r.problem = "503 without Retry-After: " + string(b)
	case r.status == http.StatusServiceUnavailable:
	case r.status != http.StatusOK:
		r.problem = fmt.Sprintf("%d: %s", r.status, b)
	case stream:
		r.problem = streamProblem(string(b))
	default:
		var c struct{ Choices []json.RawMessage }
		if err := json.Unmarshal(b, &c); err != nil || len(c.Choices) == 0 {
			r.problem = "200 without choices: " + string(b)
		}
	}
	r.end = time.Now()
	return r
}

// streamProblem says what is wrong with a 200 event stream: an error event,
// or no [DONE] at its end; "" when nothing is.
func streamProblem(body string) string {
	var last string
	for line := range strings.Lines(body) {
		d, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), "data: ")
		if !ok {
			continue
		}
		if strings.Contains(d, `"error"`) {
			return "error event in the stream: " + d
		}
		last = d
	}
	if last != "[DONE]" {
		return "the stream did not end with [DONE]: " + body
	}
	return ""
}

// load is clients goroutines sending requests for one model back to back
// (50 ms apart after one that was not served), every other one streaming,
// until finish.
type load struct {
	stop    chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	results []result
}

func startLoad(url, model string, clients int) *load {
	l := &load{stop: make(chan struct{})}
	for i := range clients {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				r := send(url, model, i%2 == 0)
				l.mu.Lock()
				l.results = append(l.results, r)
				l.mu.Unlock()
				if !r.ok() {
					// A pause, as a client honouring Retry-After would take,
					// but shorter, so that a recovery is timed to within it.
					time.Sleep(50 * time.Millisecond)
				}
			}
		}()
	}
	return l
}

// waitMore waits until the clients have finished n more requests, whatever
// their results.
func (l *load) waitMore(t *testing.T, n int) {
	t.Helper()
	before := l.done()
	testutil.Eventually(t, 60*time.Second, fmt.Sprintf("%d more requests of the load", n), func() bool { return l.done() >= before+n })
}

func (l *load) done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.results)
}

// finish stops the clients, waits for their last requests, and returns
// every request's result.
func (l *load) finish() []result {
	close(l.stop)
	l.wg.Wait()
	return l.results
}

// summary counts results: served, lost (503 with Retry-After), and the
// failed ones (anything else), described.
type summary struct {
	ok, unavailable int
	failed          []string
}

func summarize(rs []result) summary {
	var s summary
	for _, r := range rs {
		switch {
		case r.ok():
			s.ok++
		case r.lost():
			s.unavailable++
		default:
			s.failed = append(s.failed, fmt.Sprintf("%s: %s", r.start.Format("15:04:05.000"), r.problem))
		}
	}
	return s
}
