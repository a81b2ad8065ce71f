package routers

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// engine is a fake OpenAI engine that holds each completion for hold and
// counts how many it runs at once.
type engine struct {
	*httptest.Server
	hold     time.Duration // under mu
	inFlight atomic.Int64
	peak     atomic.Int64 // since the last resetPeak
	served   atomic.Int64
	mu       sync.Mutex
	prompts  []string // in order of arrival
}

func newEngine(t *testing.T, hold time.Duration) *engine {
	e := &engine{hold: hold}
	e.Server = httptest.NewServer(http.HandlerFunc(e.serve))
	t.Cleanup(e.Close)
	return e
}

func (e *engine) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/completions" {
		http.NotFound(w, r)
		return
	}
	var body struct {
		Prompt string `json:"prompt"`
	}
	_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&body)
	e.mu.Lock()
	e.prompts = append(e.prompts, body.Prompt)
	hold := e.hold
	e.mu.Unlock()
	n := e.inFlight.Add(1)
	defer e.inFlight.Add(-1)
	for p := e.peak.Load(); n > p && !e.peak.CompareAndSwap(p, n); p = e.peak.Load() {
	}
	t := time.NewTimer(hold) // the engine's work
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return
	}
	e.served.Add(1)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprint(w, `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
}

// router is one oasis-router process.
type router struct {
	*testutil.Process
	url string
}

// cluster is n routers in front of one engine, registered in one Consul
// agent, gossiping with an encryption key.
type cluster struct {
	t       *testing.T
	consul  string
	routers []*router
	args    []string
}

const apiKey = "sk-routers-test"

// startCluster runs n routers in front of e with the policy doc (and, with
// keys, the API key document) and waits until each gossips with all the
// others.
func startCluster(t *testing.T, n int, e *engine, policy, keys string) *cluster {
	t.Helper()
	engines := make([]string, n)
	for i := range engines {
		engines[i] = "m=" + strings.TrimPrefix(e.URL, "http://")
	}
	return startRouters(t, policy, keys, engines...)
}

// startRouters runs one router per -engines value, as startCluster.
func startRouters(t *testing.T, policy, keys string, engines ...string) *cluster {
	t.Helper()
	c := newCluster(t, policy, keys, true)
	for _, e := range engines {
		c.start(e)
	}
	c.waitGossip(len(engines))
	return c
}

// newCluster is a cluster of no router yet: its Consul agent and the
// routers' flags, gossip among them with peers.
func newCluster(t *testing.T, policy, keys string, peers bool) *cluster {
	t.Helper()
	_, consulAddr := testutil.StartConsul(t)
	dir := t.TempDir()
	pol := filepath.Join(dir, "policy.json")
	must.NoError(t, os.WriteFile(pol, []byte(policy), 0o600))
	keyFile := filepath.Join(dir, "gossip.key")
	must.NoError(t, os.WriteFile(keyFile, []byte(base64.StdEncoding.EncodeToString([]byte("0123456789abcdef0123456789abcdef"))+"\n"), 0o600))
	c := &cluster{t: t, consul: consulAddr, args: []string{"-discovery", "static",
		"-policy-file", pol, "-consul-addr", consulAddr, "-register", "-scrape-interval", "0", "-log-level", "warn",
		"-shutdown-timeout", "5s"}}
	if peers {
		c.args = append(c.args, "-peers-listen", "127.0.0.1:0", "-peers-key-file", keyFile)
	}
	if keys != "" {
		kf := filepath.Join(dir, "keys.json")
		must.NoError(t, os.WriteFile(kf, []byte(keys), 0o600))
		c.args = append(c.args, "-api-keys-file", kf)
	}
	return c
}

// start runs one more router on engines; extra flags follow the cluster's
// (a flag given twice: the last wins).
func (c *cluster) start(engines string, extra ...string) {
	listen := testutil.FreeAddr(c.t)
	args := append(append([]string{"-listen", listen, "-engines", engines}, c.args...), extra...)
	p := testutil.Start(c.t, exec.Command(routerBin, args...))
	c.routers = append(c.routers, &router{Process: p, url: "http://" + listen})
}

// metric sums a metric of router r's /metrics (-1 when it does not answer).
func (r *router) metric(name string, labels map[string]string) float64 {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := testutil.ScrapeMetrics(ctx, nil, r.url+"/metrics")
	if err != nil {
		return -1
	}
	return m.Sum(name, labels)
}

// waitGossip waits until every running router counts n live routers and
// gossips with all n.
func (c *cluster) waitGossip(n int) {
	testutil.Eventually(c.t, 30*time.Second, fmt.Sprintf("%d routers gossiping", n), func() bool {
		for _, r := range c.live() {
			if r.metric("oasis_router_peers_gossip", nil) != float64(n) || r.metric("oasis_router_peers_live", nil) != float64(n) {
				return false
			}
		}
		return true
	})
}

func (c *cluster) live() []*router {
	var out []*router
	for _, r := range c.routers {
		if !r.Exited() {
			out = append(out, r)
		}
	}
	return out
}

// complete posts one completion to r and returns the status.
func complete(ctx context.Context, r *router, key string) int {
	return completePrompt(ctx, r, key, "hi")
}

// completePrompt posts one completion of prompt (a plain word) to r.
func completePrompt(ctx context.Context, r *router, key, prompt string) int {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/completions",
		strings.NewReader(`{"model":"m","prompt":"`+prompt+`","max_tokens":1}`))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// burst sends per requests to each router at once and waits for every
// answer; it returns the statuses' counts.
func burst(rs []*router, per int) map[int]int {
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for _, r := range rs {
		for range per {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := complete(context.Background(), r, "")
				mu.Lock()
				counts[s]++
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	return counts
}

func digest(key string) string {
	s := sha256.Sum256([]byte(key))
	return hex.EncodeToString(s[:])
}

// waitLive waits until each of rs counts n live routers.
func (c *cluster) waitLive(rs []*router, n int) {
	testutil.Eventually(c.t, 60*time.Second, fmt.Sprintf("%d live routers", n), func() bool {
		for _, r := range rs {
			if r.metric("oasis_router_peers_live", nil) != float64(n) {
				return false
			}
		}
		return true
	})
}

// freeze stops r (SIGSTOP) until the test ends.
func freeze(t *testing.T, r *router) {
	must.NoError(t, syscall.Kill(r.Pid(), syscall.SIGSTOP))
	t.Cleanup(func() { _ = syscall.Kill(r.Pid(), syscall.SIGCONT) })
}

// paced sends requests with key to each router at 50 a second (one at a
// time per router) for window; it returns the statuses' counts (0: cut at
// the window's end) and the time it took.
func paced(rs []*router, key string, window time.Duration) (map[int]int, time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	start := time.Now()
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for _, rt := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				s := complete(ctx, rt, key)
				mu.Lock()
				counts[s]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return counts, time.Since(start)
}
