// Package disagg runs disaggregated prefill/decode end to end on the real Nomad + Consul test
// bed: recipes/tiny/sim/disagg (oasis-sim prefill and decode engines run by the llm driver,
// registered in Consul with oasis_role and oasis_pd_protocol) and jobs/router.nomad.hcl in front
// of them, for both protocols; then a prefill engine is killed under load.
package disagg

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }

const (
	recipeJob = "tiny-sim-disagg"
	modelName = "tiny-sim"
	prefills  = 2
	decodes   = 1
)

// TestDisaggregatedThroughRouter runs the recipe once per protocol behind one router: streamed
// chat completions with long prompts are paired (the decode engine computes none of the
// prompt), and killing a prefill engine under load fails no request that had not started
// streaming.
func TestDisaggregatedThroughRouter(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	url := runRouter(t, ctx)
	for _, protocol := range []string{"vllm", "sglang"} {
		t.Run(protocol, func(t *testing.T) {
			start := time.Now()
			engines := runRecipe(t, ctx, protocol)
			t.Logf("%s: recipe serving in %s", protocol, time.Since(start).Round(time.Millisecond))
			checkPaired(t, ctx, url, protocol, engines)
			killPrefillUnderLoad(t, ctx, url, engines)
			t.Logf("%s: %s in all", protocol, time.Since(start).Round(time.Millisecond))
		})
	}
}

// runRouter runs jobs/router.nomad.hcl from the stack's binaries and returns its API's URL.
func runRouter(t *testing.T, ctx context.Context) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	port := testutil.FreePort(t)
	jctx, jcancel := context.WithTimeout(ctx, 90*time.Second)
	defer jcancel()
	err = stack.RunJobFile(jctx, filepath.Join(root, "jobs", "router.nomad.hcl"), map[string]string{
		"region": stack.Region, "oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr,
		"nomad_addr": stack.NomadAddr, "http_port": strconv.Itoa(port),
	})
	if err != nil {
		logTasks(t, "oasis-router")
	}
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, stack.StopJob(context.Background(), "oasis-router")) })
	return "http://127.0.0.1:" + strconv.Itoa(port)
}

// engine is one of the recipe's engines as Consul lists it.
type engine struct {
	role, addr string
	port       int
}

// runRecipe runs recipes/tiny/sim/disagg with protocol and waits until Consul lists all its
// engines passing.
func runRecipe(t *testing.T, ctx context.Context, protocol string) []engine {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	jctx, jcancel := context.WithTimeout(ctx, 2*time.Minute)
	defer jcancel()
	err = stack.RunJobFile(jctx, filepath.Join(root, "recipes", "tiny", "sim", "disagg", "job.nomad.hcl"), map[string]string{
		"region": stack.Region, "protocol": protocol, "prefill_count": strconv.Itoa(prefills),
		"decode_count": strconv.Itoa(decodes), "speed": "1",
	})
	if err != nil {
		logTasks(t, recipeJob)
	}
	must.NoError(t, err)
	t.Cleanup(func() {
		must.NoError(t, stack.StopJob(context.Background(), recipeJob))
		// The next protocol's engines must not meet these in the router's pool.
		testutil.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "the recipe's engines to leave Consul", func() bool { return len(passing(t, protocol)) == 0 })
	})
	var engines []engine
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		engines = passing(t, protocol)
		return len(engines) == prefills+decodes
	}), wait.Timeout(60*time.Second), wait.Gap(200*time.Millisecond)), must.Func(func() string {
		logTasks(t, recipeJob)
		return fmt.Sprint("engines passing: ", engines)
	}))
	return engines
}

// passing lists the recipe's engines of protocol that pass their checks.
func passing(t *testing.T, protocol string) []engine {
	entries, _, err := stack.Consul.Health().Service("oasis-engine", "", true, nil)
	must.NoError(t, err)
	var out []engine
	for _, e := range entries {
		if e.Service.Meta["oasis_model"] != modelName || e.Service.Meta["oasis_pd_protocol"] != protocol {
			continue
		}
		out = append(out, engine{role: e.Service.Meta["oasis_role"], port: e.Service.Port,
			addr: net.JoinHostPort(e.Service.Address, strconv.Itoa(e.Service.Port))})
	}
	return out
}

func (e engine) String() string { return e.role + "@" + e.addr }

var nonce atomic.Int64

// prompt is a chat prompt of about 2,400 characters (the router's estimate without a
// tokenizer: ~600 tokens, past the default 256-token threshold) that starts with a fresh nonce,
// so that no engine holds its prefix.
func prompt() string {
	return fmt.Sprintf("request %d at %d: ", nonce.Add(1), time.Now().UnixNano()) +
		strings.Repeat("disaggregated serving computes the prompt on one engine and decodes on another. ", 30)
}

// result is what a client saw of one streamed request.
type result struct {
	status    int
	firstByte bool // a data event arrived
	events    []string
	err       error
}

func (r result) ok() bool {
	return r.err == nil && r.status == http.StatusOK && len(r.events) >= 2 && r.events[len(r.events)-1] == "[DONE]"
}

// stream sends one streamed chat completion and reads its SSE events; the error says what was
// wrong with the stream (not well-formed, no [DONE], an error event).
func stream(ctx context.Context, url string, maxTokens int) result {
	body := fmt.Sprintf(`{"model":%q,"stream":true,"max_tokens":%d,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":%q}]}`,
		modelName, maxTokens, prompt())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return result{err: err}
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{err: err}
	}
	defer resp.Body.Close()
	r := result{status: resp.StatusCode}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		r.err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
		return r
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, ":") {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			r.err = fmt.Errorf("not an SSE data line: %q", line)
			return r
		}
		r.firstByte = true
		if len(r.events) > 0 && r.events[len(r.events)-1] == "[DONE]" {
			r.err = fmt.Errorf("data after [DONE]: %q", data)
			return r
		}
		if strings.Contains(data, `"error"`) {
			r.err = fmt.Errorf("error event: %s", data)
		}
		r.events = append(r.events, data)
	}
	if err := sc.Err(); err != nil && r.err == nil {
		r.err = err
	}
	if r.err == nil && (len(r.events) < 2 || r.events[len(r.events)-1] != "[DONE]") {
		r.err = fmt.Errorf("stream did not end with [DONE] after a chunk: %v", r.events)
	}
	return r
}

// checkPaired waits until the router pairs requests, then asserts that paired streams are
// well-formed and that the decode engines computed none of their prompts.
func checkPaired(t *testing.T, ctx context.Context, url, protocol string, engines []engine) {
	t.Helper()
	// Until the router's pool holds the prefill engines a request may go direct (vLLM) or wait
	// for a room that never comes (SGLang): wait until one is paired.
	pairs := func() float64 {
		return metric(t, url, "oasis_router_disagg_requests_total", map[string]string{"model": modelName, "path": "pair"})
	}
	before := pairs()
	var last result
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		last = stream(rctx, url, 4)
		return last.ok() && pairs() > before
	}), wait.Timeout(60*time.Second), wait.Gap(500*time.Millisecond)), must.Func(func() string {
		logTasks(t, "oasis-router")
		return fmt.Sprintf("no paired request; last: %+v", last)
	}))

	local, remote := decodePromptTokens(t, engines)
	before = pairs()
	const n = 4
	start := time.Now()
	for range n {
		r := stream(ctx, url, 16)
		must.True(t, r.ok(), must.Sprintf("%+v", r))
		ids := map[string]bool{}
		for _, e := range r.events[:len(r.events)-1] {
			if i := strings.Index(e, `"id":"`); i >= 0 {
				ids[e[i+6:i+6+strings.IndexByte(e[i+6:], '"')]] = true
			}
		}
		must.MapLen(t, 1, ids, must.Sprint("chunks of more than one completion: ", r.events))
	}
	t.Logf("%s: %d paired streams of 16 tokens in %s", protocol, n, time.Since(start).Round(time.Millisecond))
	must.Eq(t, float64(n), pairs()-before)
	local2, remote2 := decodePromptTokens(t, engines)
	must.Eq(t, local, local2, must.Sprint("a decode engine computed prompt tokens"))
	must.Greater(t, remote, remote2, must.Sprint("the decode engines pulled no prompt tokens"))
	t.Logf("%s: decode engines pulled %.0f prompt tokens, computed %.0f", protocol, remote2-remote, local2-local)
}

// decodePromptTokens sums the decode engines' prompt tokens by source.
func decodePromptTokens(t *testing.T, engines []engine) (local, remote float64) {
	t.Helper()
	for _, e := range engines {
		if e.role != "decode" {
			continue
		}
		local += metric(t, "http://"+e.addr, "oasis_sim_prompt_tokens_total", map[string]string{"source": "local"})
		remote += metric(t, "http://"+e.addr, "oasis_sim_prompt_tokens_total", map[string]string{"source": "remote"})
	}
	return local, remote
}

// killPrefillUnderLoad runs 8 clients in a loop, SIGKILLs one prefill engine's process after
// 3 s and keeps the load on for 6 s more. No request may fail before its first byte (the router
// moves the prefill leg, or the pair, to the surviving prefill engine); a request that fails
// after it had started streaming is only counted (the router retries nothing after the first
// byte; with these protocols a prefill engine's death cannot reach a stream that began).
func killPrefillUnderLoad(t *testing.T, ctx context.Context, url string, engines []engine) {
	t.Helper()
	var victim engine
	for _, e := range engines {
		if e.role == "prefill" {
			victim = e
			break
		}
	}
	pid := enginePID(t, victim.port)
	paths := func(path string) float64 {
		return metric(t, url, "oasis_router_disagg_requests_total", map[string]string{"model": modelName, "path": path})
	}
	pairsBefore, fallbacksBefore := paths("pair"), paths("fallback")
	localBefore, remoteBefore := decodePromptTokens(t, engines)
	const clients = 8
	lctx, stop := context.WithCancel(ctx)
	var (
		mu      sync.Mutex
		results []result
		wg      sync.WaitGroup
	)
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for lctx.Err() == nil {
				r := stream(ctx, url, 32) // not lctx: a request in flight at the end completes
				mu.Lock()
				results = append(results, r)
				mu.Unlock()
			}
		}()
	}
	finished := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(results)
	}
	testutil.Eventually(t, 60*time.Second, "the load's first 3 requests per client", func() bool { return finished() >= 3*clients })
	atKill := finished()
	must.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	killed := time.Now()
	// Requests that started after the kill, 6 per client, have finished.
	testutil.Eventually(t, 90*time.Second, "6 more requests per client after the kill", func() bool { return finished() >= atKill+7*clients })
	stop()
	wg.Wait()

	var done, failedStreaming, failedBefore int
	for _, r := range results {
		switch {
		case r.ok():
			done++
		case r.firstByte:
			failedStreaming++
			t.Logf("failed after its first byte: %v", r.err)
		default:
			failedBefore++
			t.Logf("failed before its first byte: %v", r.err)
		}
	}
	t.Logf("killed prefill engine %s (pid %d) after %d requests; %d requests in all, %.1f s after the kill: %d completed, %d failed after streaming began, %d failed before",
		victim, pid, atKill, len(results), time.Since(killed).Seconds(), done, failedStreaming, failedBefore)
	must.Eq(t, 0, failedBefore, must.Sprint("requests that had not started streaming failed"))
	must.Greater(t, atKill, len(results), must.Sprint("no request ran after the kill"))
	// The kill cost no remote prefill: the other prefill engine took over, nothing fell back to a
	// local prefill on the decode engine.
	must.Eq(t, float64(len(results)), paths("pair")-pairsBefore)
	must.Eq(t, 0, paths("fallback")-fallbacksBefore)
	local, remote := decodePromptTokens(t, engines)
	must.Eq(t, localBefore, local, must.Sprint("a decode engine computed prompt tokens"))
	must.Greater(t, remoteBefore, remote)
	t.Logf("router prefill failures: %.0f, decode failures: %.0f",
		metric(t, url, "oasis_router_disagg_failures_total", map[string]string{"model": modelName, "leg": "prefill"}),
		metric(t, url, "oasis_router_disagg_failures_total", map[string]string{"model": modelName, "leg": "decode"}))
}

// enginePID finds the oasis-sim process serving on port.
func enginePID(t *testing.T, port int) int {
	t.Helper()
	needle := []byte(fmt.Sprintf("\x00--port\x00%d\x00", port))
	entries, err := os.ReadDir("/proc")
	must.NoError(t, err)
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err == nil && strings.Contains(string(cmdline), string(needle)) && strings.Contains(string(cmdline), "oasis-sim\x00serve\x00") {
			return pid
		}
	}
	t.Fatalf("no oasis-sim process serves port %d", port)
	return 0
}

// metric sums a family's series on a /metrics page whose labels include want.
func metric(t *testing.T, url, name string, want map[string]string) float64 {
	t.Helper()
	ms, err := testutil.ScrapeMetrics(context.Background(), nil, url+"/metrics")
	must.NoError(t, err)
	return ms.Sum(name, want)
}

// logTasks logs a job's allocations' task events and stderr tails, for a failure message.
func logTasks(t *testing.T, job string) {
	allocs, _, err := stack.Nomad.Jobs().Allocations(job, true, nil)
	if err != nil {
		t.Logf("listing %s allocations: %v", job, err)
		return
	}
	for _, a := range allocs {
		for name, st := range a.TaskStates {
			for _, e := range st.Events {
				t.Logf("%s %s %s: %s %s", job, a.ID[:8], name, e.Type, e.DisplayMessage)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			text, _ := stack.TaskLog(ctx, a.ID, name, "stderr")
			cancel()
			if len(text) > 4000 {
				text = text[len(text)-4000:]
			}
			t.Logf("%s %s %s stderr:\n%s", job, a.ID[:8], name, text)
		}
	}
}
