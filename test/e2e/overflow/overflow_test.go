// Package overflow runs the policy features that send a request to another model end to end
// (TestCascadeOnTheTestBed: a small-to-large cascade) and a model's overflow to a hosted endpoint on
// the real Nomad + Consul test bed: an oasis-sim engine run by the llm driver,
// a fake hosted OpenAI-compatible API registered by the hosted recipe, and
// jobs/router.nomad.hcl allowing that upstream, with a policy in Consul KV
// that saturates the sim pool at one request.
package overflow

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) { os.Exit(testbed.Main(m, testbed.Options{}, &stack)) }

const (
	localModel  = "e2e-local"
	hostedPool  = "e2e-hosted"
	hostedName  = "vendor/big-model" // the hosted API's name for the model
	hostedJobID = "hosted-openai-compat-fallback"
	keyEnv      = "OASIS_UPSTREAM_KEY_E2E"
	hostedKey   = "sk-e2e-overflow"
)

// fakeHosted is a hosted OpenAI-compatible API recording the model and key
// of each completion request (the llm driver's probes are not recorded).
type fakeHosted struct {
	url  string
	mu   sync.Mutex
	seen []string // "model key"
}

func newFakeHosted(t *testing.T) *fakeHosted {
	f := &fakeHosted{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/v1/chat/completions" {
			fmt.Fprint(w, `{"object":"list","data":[{"id":"`+hostedName+`","object":"model"}]}`)
			return
		}
		var b struct{ Model string }
		_ = json.NewDecoder(r.Body).Decode(&b)
		f.mu.Lock()
		f.seen = append(f.seen, b.Model+" "+r.Header.Get("Authorization"))
		f.mu.Unlock()
		fmt.Fprint(w, `{"id":"h","object":"chat.completion","model":"`+b.Model+`","choices":[{"index":0,"message":{"role":"assistant","content":"from hosted"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	}))
	t.Cleanup(srv.Close)
	f.url = srv.URL + "/v1"
	return f
}

func (f *fakeHosted) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.seen...)
}

// TestOverflowToHosted: with the sim pool admitting one request and queueing
// none, concurrent requests beyond it are answered by the hosted endpoint
// under its own model name (X-Oasis-Overflow: queue_full), counted in
// oasis_router_overflow_requests_total; one at a time, the hosted endpoint,
// which is the overflow and not a peer, sees nothing.
func TestOverflowToHosted(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	hosted := newFakeHosted(t)
	routerURL := runJobs(t, ctx, hosted.url)
	waitServes(t, ctx, routerURL)

	// One at a time: the local engine answers.
	for range 3 {
		status, hdr, body := chat(t, routerURL, 4)
		must.Eq(t, http.StatusOK, status, must.Sprint(body))
		must.Eq(t, "", hdr.Get("X-Oasis-Overflow"))
		must.StrContains(t, body, `"model":"`+localModel+`"`)
	}
	must.SliceEmpty(t, hosted.requests())
	// A client reads a whole answer (its Content-Length) a moment before the
	// router, reading the engine's end, gives the slot back.
	waitIdle(t, routerURL)

	// Saturated: 6 at once, each taking about 1 s on the engine.
	type result struct {
		status   int
		overflow string
		body     string
	}
	results := make(chan result, 6)
	for range 6 {
		go func() {
			status, hdr, body := chat(t, routerURL, 24)
			results <- result{status, hdr.Get("X-Oasis-Overflow"), body}
		}()
	}
	overflowed := 0
	for range 6 {
		r := <-results
		must.Eq(t, http.StatusOK, r.status, must.Sprint(r.body))
		if r.overflow != "" {
			must.Eq(t, "queue_full", r.overflow)
			must.StrContains(t, r.body, "from hosted")
			overflowed++
		}
	}
	must.Eq(t, 5, overflowed, must.Sprint("one request fits the local pool; the others overflow"))
	seen := hosted.requests()
	must.SliceLen(t, overflowed, seen)
	for _, s := range seen {
		must.Eq(t, hostedName+" Bearer "+hostedKey, s)
	}
	metrics := get(t, routerURL+"/metrics")
	must.StrContains(t, metrics, fmt.Sprintf(`oasis_router_overflow_requests_total{model=%q,reason="queue_full"} %d`, localModel, overflowed))
}

// runJobs writes the policy, runs the engine, the hosted recipe and the
// router job, and returns the router's URL.
func runJobs(t *testing.T, ctx context.Context, hostedURL string) string {
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	doc := `{"policy":"round_robin","models":{"` + localModel + `":{
	  "admission":{"max_in_flight":1,"max_queue":0},
	  "overflow":{"pool":"` + hostedPool + `","when":"queue_full","model":"` + hostedName + `"}}}}`
	_, err = stack.Consul.KV().Put(&consulapi.KVPair{Key: "oasis/router/policy", Value: []byte(doc)}, nil)
	must.NoError(t, err)
	_, _, err = stack.Nomad.Variables().Create(&nomadapi.Variable{Path: "nomad/jobs/oasis-router",
		Items: nomadapi.VariableItems{keyEnv: hostedKey}}, nil)
	must.NoError(t, err)
	t.Cleanup(func() {
		for _, id := range []string{hostedJobID, "overflow-engine", "oasis-router"} {
			_ = stack.StopJob(context.Background(), id)
		}
	})

	_, err = stack.RunJobHCL(ctx, testbed.SimEngine{ID: "overflow-engine", Model: localModel,
		Config: `extra_args = ["--step-time-base", "40ms"]`}.HCL())
	must.NoError(t, err)
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "recipes", "hosted", "openai-compat", "fallback", "job.nomad.hcl"),
		map[string]string{"model": hostedPool, "endpoint": hostedURL, "key_env": keyEnv}))
	_, err = stack.WaitServicePassing(ctx, "oasis-engine", 2)
	must.NoError(t, err)

	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "router.nomad.hcl"), map[string]string{
		"oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr, "nomad_addr": stack.NomadAddr,
		"http_port":        strconv.Itoa(ports[0]),
		"hosted_upstreams": fmt.Sprintf("[%q]", hostedURL),
		"hosted_key_envs":  fmt.Sprintf("[%q]", keyEnv+"="+hostedURL)}))
	return "http://127.0.0.1:" + strconv.Itoa(ports[0])
}

// waitServes waits until the router answers a request for the local model.
func waitServes(t *testing.T, ctx context.Context, url string) {
	var last string
	must.Wait(t, wait.InitialSuccess(wait.BoolFunc(func() bool {
		if ctx.Err() != nil {
			return false
		}
		status, _, body := chat(t, url, 1)
		last = strconv.Itoa(status) + " " + body
		return status == http.StatusOK
	}), wait.Timeout(90*time.Second), wait.Gap(500*time.Millisecond)), must.Func(func() string { return "last answer: " + last }))
}

func chat(t *testing.T, url string, maxTokens int) (int, http.Header, string) {
	body := `{"model":"` + localModel + `","messages":[{"role":"user","content":"hello"}],"max_tokens":` + strconv.Itoa(maxTokens) + `}`
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, nil, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func get(t *testing.T, url string) string {
	resp, err := http.Get(url)
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return string(b)
}

// waitIdle waits until the router has no request in flight to the local engine.
func waitIdle(t *testing.T, url string) {
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, "no request in flight to the local engine", func() bool {
		for _, l := range strings.Split(get(t, url+"/metrics"), "\n") {
			if strings.HasPrefix(l, "oasis_router_worker_in_flight{") && strings.Contains(l, `model="`+localModel+`"`) &&
				!strings.HasSuffix(l, " 0") {
				return false
			}
		}
		return true
	})
}
