package localstack

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// TestUpServesThroughRouterAndDownLeavesNothing does what `make up` and `make down` do, in a
// temporary home: the system jobs and the demo recipe on real Consul + Nomad, a streamed chat
// completion through the router, a shared-prefix burst that shows prefix-cache hits in the
// router's and the engines' metrics, and a teardown that leaves no process or directory.
func TestUpServesThroughRouterAndDownLeavesNothing(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	home := filepath.Join(traversableTempDir(t), "oasis-home")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	var out bytes.Buffer
	s, err := Up(ctx, root, home, io.MultiWriter(&out, testWriter{t}), Options{})
	downAtEnd(t, home)
	if err != nil && s != nil {
		t.Logf("nomad log:\n%s", s.NomadLog())
	}
	must.NoError(t, err)
	for _, want := range []string{"ran jobs/kvcached.nomad.hcl", "ran jobs/router.nomad.hcl", "ran recipes/tiny/sim/agg/job.nomad.hcl", "OpenAI API: http://", "curl -N", "Prometheus: http://127.0.0.1:"} {
		must.StrContains(t, out.String(), want)
	}

	engines, err := s.WaitServicePassing(ctx, "oasis-engine", 3)
	must.NoError(t, err)
	must.Len(t, 3, engines)
	routers, err := s.WaitServicePassing(ctx, "oasis-router", 1)
	must.NoError(t, err)
	router := fmt.Sprintf("http://%s:%d", routers[0].Service.Address, routers[0].Service.Port)
	waitReady(t, ctx, router)

	// A streamed chat completion through the router.
	events := streamChat(t, ctx, router, "You are a helpful assistant.", "Hello, Oasis!")
	must.Greater(t, 1, len(events))
	must.Eq(t, "[DONE]", events[len(events)-1])

	// A shared-prefix burst: one long system prompt, many different questions.
	system := strings.Repeat("Oasis routes each request to the engine that already holds its prefix. ", 40)
	for i := range 24 {
		streamChat(t, ctx, router, system, fmt.Sprintf("Question number %d: what is cached?", i))
	}
	var hits float64
	for _, e := range engines {
		hits += metricSum(t, ctx, fmt.Sprintf("http://%s:%d/metrics", e.Service.Address, e.Service.Port), "vllm:prefix_cache_hits_total")
	}
	// 24 requests share a prefix of several hundred tokens: all but the first few must hit.
	must.Greater(t, 1000, hits, must.Sprint("engines report too few prefix-cache hit tokens"))
	routerHits := metricSum(t, ctx, router+"/metrics", "oasis_router_prefix_matched_blocks_total")
	must.Greater(t, 0, routerHits, must.Sprint("the router saw no cached prefix in its index"))

	// make down: nothing left behind.
	downLeavesNothing(t, home, "stack")
}

// TestUpWithLlamaCpp is `make up ENGINE=llama-cpp`: the demo recipe on real llama-server
// engines the driver launches, a streamed chat of real tokens through the router, and a
// teardown that leaves nothing.
func TestUpWithLlamaCpp(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	home := filepath.Join(traversableTempDir(t), "oasis-home")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	var out bytes.Buffer
	s, err := Up(ctx, root, home, io.MultiWriter(&out, testWriter{t}), Options{Engine: EngineLlamaCpp})
	downAtEnd(t, home)
	if err != nil && s != nil {
		t.Logf("nomad log:\n%s", s.NomadLog())
	}
	must.NoError(t, err)
	for _, want := range []string{"made the tiny llama.cpp model", "ran recipes/tiny/llama-cpp/cpu/job.nomad.hcl", `"model":"tiny-llama"`} {
		must.StrContains(t, out.String(), want)
	}
	engines, err := s.WaitServicePassing(ctx, "oasis-engine", 3)
	must.NoError(t, err)
	for _, e := range engines {
		must.Eq(t, "llama_cpp", e.Service.Meta["oasis_engine"])
	}
	routers, err := s.WaitServicePassing(ctx, "oasis-router", 1)
	must.NoError(t, err)
	router := fmt.Sprintf("http://%s:%d", routers[0].Service.Address, routers[0].Service.Port)
	waitReady(t, ctx, router)

	events := streamChatWith(t, ctx, http.DefaultClient, router, llamaModel, "You are a helpful assistant.", "Hello, Oasis!")
	must.Eq(t, "[DONE]", events[len(events)-1])
	var text strings.Builder
	for _, ev := range events[:len(events)-1] {
		var chunk struct {
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Content *string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		must.NoError(t, json.Unmarshal([]byte(ev), &chunk), must.Sprint(ev))
		must.Eq(t, llamaModel, chunk.Model)
		for _, c := range chunk.Choices {
			if c.Delta.Content != nil {
				text.WriteString(*c.Delta.Content)
			}
		}
	}
	must.NotEq(t, "", text.String(), must.Sprint("llama-server streamed no text"))
	t.Logf("tiny-llama through the router: %q", text.String())

	downLeavesNothing(t, home, "stack")
}

// downAtEnd takes the stack under home down when the test ends, however it ended: a home that
// no longer exists was taken down already (downLeavesNothing).
func downAtEnd(t *testing.T, home string) {
	t.Cleanup(func() {
		if _, err := os.Stat(home); err != nil {
			return
		}
		if err := Down(home, io.Discard); err != nil {
			t.Errorf("down after failure: %v", err)
		}
	})
}

// downLeavesNothing runs Down on home and asserts that no process found
// under it while it was up survives, nor the directory itself.
func downLeavesNothing(t *testing.T, home, what string) {
	t.Helper()
	pids := stackPIDs(t, home)
	must.Greater(t, 0, len(pids), must.Sprintf("found no processes of the %s while it was up", what))
	must.NoError(t, Down(home, io.Discard))
	for _, pid := range pids {
		must.False(t, running(pid), must.Sprintf("process %d survived make down", pid))
	}
	_, err := os.Stat(home)
	must.True(t, os.IsNotExist(err), must.Sprintf("the %s's home directory survived make down", what))
}

// traversableTempDir is a temporary directory other users may traverse, as the checkout's .oasis
// is: the llm driver may run engines as another user, from the stack's directory under it
// (t.TempDir and its parent are the test user's only).
func traversableTempDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{dir, filepath.Dir(dir)} {
		must.NoError(t, os.Chmod(d, 0o755))
	}
	return dir
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func waitReady(t *testing.T, ctx context.Context, router string) {
	t.Helper()
	waitReadyWith(t, ctx, http.DefaultClient, router)
}

// waitReadyWith waits until the router's /ready answers 200 through client;
// a failure shows the last answer.
func waitReadyWith(t *testing.T, ctx context.Context, client *http.Client, router string) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, router+"/ready", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("router %s never became ready: %w", router, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("router %s never became ready: last status %d", router, resp.StatusCode)
		}
		return nil
	}), wait.Timeout(60*time.Second), wait.Gap(200*time.Millisecond)))
}

// streamChat sends a streaming chat completion and returns the SSE data payloads in order.
func streamChat(t *testing.T, ctx context.Context, router, system, user string) []string {
	t.Helper()
	return streamChatWith(t, ctx, http.DefaultClient, router, demoModel, system, user)
}

func streamChatWith(t *testing.T, ctx context.Context, c *http.Client, router, model, system, user string) []string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model":      model,
		"stream":     true,
		"max_tokens": 8,
		"messages": []map[string]string{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
	})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, router+"/v1/chat/completions", bytes.NewReader(body))
	must.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	must.NoError(t, err)
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("chat completion: %s: %s", resp.Status, b)
	}
	must.StrHasPrefix(t, "text/event-stream", resp.Header.Get("Content-Type"))
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, data)
		}
	}
	must.NoError(t, sc.Err())
	return events
}

// metricSum sums a metric over the series whose labels include want (every series with none).
func metricSum(t *testing.T, ctx context.Context, url, name string, want ...map[string]string) float64 {
	t.Helper()
	ms, err := testutil.ScrapeMetrics(ctx, nil, url)
	must.NoError(t, err)
	var labels map[string]string
	if len(want) > 0 {
		labels = want[0]
	}
	return ms.Sum(name, labels)
}

// running reports whether pid is a live process. A killed task whose parent (here the machine's
// init) has not reaped it yet is a zombie: gone, though kill(pid, 0) still succeeds.
func running(pid int) bool {
	if syscall.Kill(pid, 0) != nil {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name: "pid (comm) S ...".
	if i := bytes.LastIndexByte(stat, ')'); i >= 0 && i+2 < len(stat) {
		return stat[i+2] != 'Z'
	}
	return true
}

// stackPIDs lists processes whose command line names the stack's home.
func stackPIDs(t *testing.T, home string) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	must.NoError(t, err)
	var pids []int
	for _, e := range entries {
		var pid int
		if _, err := fmt.Sscanf(e.Name(), "%d", &pid); err != nil || pid == os.Getpid() {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && bytes.Contains(cmdline, []byte(home)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestUpFederationServesInEachDC is `make up DCS=2` and `make down`: two federated datacenters,
// each running the system jobs and the demo recipe in its own region, a streamed chat completion
// through each datacenter's router, an env file per datacenter; then what the output says to try:
// with dc1's demo engines stopped, dc1's router serves the model through dc2's (federated routers);
// and a teardown that leaves no process or directory.
func TestUpFederationServesInEachDC(t *testing.T) {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	home := filepath.Join(traversableTempDir(t), "oasis-home")
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()

	var out bytes.Buffer
	start := time.Now()
	f, err := UpFederation(ctx, root, home, 2, io.MultiWriter(&out, testWriter{t}))
	downAtEnd(t, home)
	must.NoError(t, err)
	t.Logf("make up DCS=2 (federation, jobs and recipes in both regions) took %s", time.Since(start).Round(100*time.Millisecond))
	for _, want := range []string{"ran jobs/router.nomad.hcl in region dc1", "ran recipes/tiny/sim/agg/job.nomad.hcl in region dc2", "Datacenter dc2 (Nomad region dc2)"} {
		must.StrContains(t, out.String(), want)
	}
	must.Eq(t, 2, strings.Count(out.String(), "OpenAI API: http://"))
	must.Eq(t, 2, strings.Count(out.String(), "Prometheus: http://127.0.0.1:"))

	routers := map[string]string{}
	for _, s := range f.DCs {
		env, err := os.Stat(DCEnvPath(home, s.Datacenter))
		must.NoError(t, err)
		must.Eq(t, os.FileMode(0o600), env.Mode().Perm())
		engines, err := s.WaitServicePassing(ctx, "oasis-engine", 3)
		must.NoError(t, err)
		must.Len(t, 3, engines, must.Sprintf("engines in %s", s.Datacenter))
		rs, err := s.WaitServicePassing(ctx, "oasis-router", 1)
		must.NoError(t, err)
		router := fmt.Sprintf("http://%s:%d", rs[0].Service.Address, rs[0].Service.Port)
		routers[s.Datacenter] = router
		waitReady(t, ctx, router)
		events := streamChat(t, ctx, router, "You are a helpful assistant.", "Hello from "+s.Datacenter)
		must.Eq(t, "[DONE]", events[len(events)-1])
		// Each datacenter's Prometheus scrapes its own router, found through its own Consul.
		prom, err := PrometheusURL(home, s.Datacenter)
		must.NoError(t, err)
		waitRouterScraped(t, ctx, prom, rs[0].Service.Port)
	}
	must.NotEq(t, routers["dc1"], routers["dc2"])

	// The routers federate. What the output says to try: stop dc1's demo engines, so that only
	// dc2 serves the model, and ask dc1's router again; dc2 serves it, and dc1 counts the forward.
	dc1 := f.DC("dc1")
	job, err := demoJobID(dc1, root)
	must.NoError(t, err)
	for _, want := range []string{"Federation: the routers of dc1 and dc2", FederationTLSDir(home), "bin/nomad job stop " + job,
		"curl -N " + routers["dc1"] + "/v1/chat/completions", "oasis_router_federation_forwarded_total"} {
		must.StrContains(t, out.String(), want)
	}
	for _, name := range []string{"ca.pem", "ca-key.pem", "router-dc1.pem", "router-dc2-key.pem"} {
		_, err := os.Stat(filepath.Join(FederationTLSDir(home), name))
		must.NoError(t, err)
	}
	must.NoError(t, dc1.StopJob(ctx, job))
	testutil.Eventually(t, 60*time.Second, "dc1 without engines in its Consul", func() bool {
		engines, _, err := dc1.Consul.Health().Service("oasis-engine", "", false, nil)
		return err == nil && len(engines) == 0
	})
	// dc1's engines leave Consul before they stop (shutdown_delay, then the driver's drain), so
	// the first requests may still be served in dc1 while its router's pool catches up: wait
	// until one is served and counted as forwarded to dc2 for want of a local worker.
	var last error
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if last = tryStream(ctx, routers["dc1"]); last != nil {
			return last
		}
		if metricSum(t, ctx, routers["dc1"]+"/metrics", "oasis_router_federation_forwarded_total",
			map[string]string{"dc": "dc2", "reason": "no_local_worker"}) == 0 {
			last = errors.New("served, but not forwarded to dc2 (a dc1 engine still in the router's pool)")
		}
		return last
	}), wait.Timeout(60*time.Second), wait.Gap(500*time.Millisecond)),
		must.Func(func() string {
			return fmt.Sprintf("dc1's router never served %s through dc2; last: %v", demoModel, last)
		}))

	downLeavesNothing(t, home, "federation")
}

// tryStream sends a streamed chat completion of the demo model; an error unless it answers 200
// and ends with [DONE] after at least one chunk.
func tryStream(ctx context.Context, router string) error {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":4,"messages":[{"role":"user","content":"hello"}]}`, demoModel)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, router+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(b))
	}
	var events []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			events = append(events, data)
		}
	}
	if len(events) < 2 || events[len(events)-1] != "[DONE]" {
		return fmt.Errorf("stream did not end with [DONE] after a chunk: %v (%v)", events, sc.Err())
	}
	return nil
}

// waitRouterScraped waits until the Prometheus at prom reports its oasis-router target on port up.
func waitRouterScraped(t *testing.T, ctx context.Context, prom string, port int) {
	t.Helper()
	testutil.Eventually(t, 60*time.Second, "prometheus at "+prom+" scraping the router on port "+strconv.Itoa(port), func() bool {
		res, err := testbed.PromQuery(ctx, prom, `up{job="oasis-router"}`)
		if err != nil {
			return false
		}
		for _, r := range res {
			if strings.HasSuffix(r.Metric["instance"], ":"+strconv.Itoa(port)) && r.Value == 1 {
				return true
			}
		}
		return false
	})
}
