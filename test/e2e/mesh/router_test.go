package mesh

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// meshIdentity is a Connect identity for service svc, closed when the test ends.
func meshIdentity(t *testing.T, ctx context.Context, svc string) *meshid.Identity {
	t.Helper()
	id, err := stack.MeshIdentity(ctx, svc)
	must.NoError(t, err)
	t.Cleanup(func() { must.NoError(t, id.Close()) })
	return id
}

// meshClient calls service target with id's certificate, keeping connections alive.
func meshClient(id *meshid.Identity, target string) *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		TLSClientConfig: id.ClientConfig(target, "h2", "http/1.1"), ForceAttemptHTTP2: true}}
}

// meshEndpoints are the passing mesh addresses of service (its sidecars, or its own
// Connect-native listeners), keyed by the service instance they reach.
func meshEndpoints(t *testing.T, service string) map[string]string {
	t.Helper()
	entries, _, err := stack.Consul.Health().Connect(service, "", true, nil)
	must.NoError(t, err)
	out := map[string]string{}
	for _, e := range entries {
		id := e.Service.ID
		if e.Service.Proxy != nil && e.Service.Proxy.DestinationServiceID != "" {
			id = e.Service.Proxy.DestinationServiceID
		}
		out[id] = net.JoinHostPort(e.Service.Address, strconv.Itoa(e.Service.Port))
	}
	return out
}

// startMeshStack applies the shipped intentions and runs the mesh recipe's engines and the
// router job in the mesh, as `make up MESH=1` does; it returns the router's mesh address.
func startMeshStack(t *testing.T, ctx context.Context, engines int) string {
	t.Helper()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	must.NoError(t, stack.ApplyIntentions(ctx))
	vars := stack.MeshVariables()
	vars["count"], vars["speed"] = strconv.Itoa(engines), "1"
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "recipes", "tiny", "sim", "agg-mesh", "job.nomad.hcl"), vars))
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), "tiny-sim-agg-mesh") })
	_, err = stack.WaitMeshPassing(ctx, engines)
	must.NoError(t, err)
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "jobs", "router.nomad.hcl"), map[string]string{
		"oasis_bin_dir": stack.BinDir, "consul_addr": stack.ConsulAddr, "nomad_addr": stack.NomadAddr,
		"http_port": strconv.Itoa(ports[0]), "mesh_enabled": "true"}))
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), "oasis-router") })
	var addr string
	testutil.Eventually(t, 60*time.Second, "the router's Connect-native service", func() bool {
		for _, a := range meshEndpoints(t, "oasis-router") {
			addr = a
		}
		return addr != ""
	})
	return addr
}

func TestRouterInTheMesh(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	routerAddr := startMeshStack(t, ctx, 2)
	base := "https://" + routerAddr
	client := meshClient(meshIdentity(t, ctx, "oasis-client"), "oasis-router")
	testutil.Eventually(t, 90*time.Second, "the router to serve tiny-sim through the mesh", func() bool {
		code, _, err := meshChat(ctx, client, base, "warm up", 4, false)
		return err == nil && code == http.StatusOK
	})

	t.Run("stream through router, sidecar, engine", func(t *testing.T) {
		code, body, err := meshChat(ctx, client, base, "Hello through the mesh", 16, true)
		must.NoError(t, err)
		must.EqOp(t, http.StatusOK, code, must.Sprint(body))
		must.StrHasSuffix(t, "data: [DONE]\n\n", body)
	})

	t.Run("no intention: refused at the handshake", func(t *testing.T) {
		intruder := meshClient(meshIdentity(t, ctx, "intruder"), "oasis-router")
		_, _, err := meshChat(ctx, intruder, base, "let me in", 4, false)
		must.Error(t, err)
	})

	t.Run("shared-prefix burst goes to the holder", func(t *testing.T) {
		sharedPrefixBurst(t, ctx, client, base)
	})

	t.Run("router to engine intention removed and restored", func(t *testing.T) {
		must.NoError(t, stack.SetIntention(ctx, "oasis-router", "deny"))
		removed := time.Now()
		testutil.Eventually(t, 30*time.Second, "503 without the router → engine intention", func() bool {
			code, _, err := meshChat(ctx, client, base, "are you there", 4, false)
			return err == nil && code == http.StatusServiceUnavailable
		})
		t.Logf("requests answered 503 %v after the intention was removed", time.Since(removed).Round(10*time.Millisecond))
		must.NoError(t, stack.ApplyIntentions(ctx))
		restored := time.Now()
		testutil.Eventually(t, 30*time.Second, "200 once the intention is back", func() bool {
			code, _, err := meshChat(ctx, client, base, "are you back", 4, false)
			return err == nil && code == http.StatusOK
		})
		t.Logf("requests answered 200 %v after the intention was restored", time.Since(restored).Round(10*time.Millisecond))
	})

	t.Run("leaf rotation during a stream drops nothing", func(t *testing.T) {
		const tokens = 9000 // ~56 s at the sim's real-time pace: a leaf rotation took 20–29 s here
		// The stream only has to outlast the rotation; on a loaded machine the sim falls behind
		// its pace, so this one request gets more than the shared client's 60 s.
		long := *client
		long.Timeout = 3 * time.Minute
		done := make(chan error, 1)
		var body string
		go func() {
			var code int
			var err error
			code, body, err = meshChat(ctx, &long, base, "a long answer please", tokens, true)
			if err == nil && code != http.StatusOK {
				err = fmt.Errorf("status %d: %s", code, body)
			}
			done <- err
		}()
		testutil.RotateConnectCA(t, stack.Consul)
		testutil.Eventually(t, 60*time.Second, "the router's new leaf", func() bool {
			return routerMetric(ctx, client, base, `oasis_router_mesh_rotations_total{what="leaf"}`) >= 1
		})
		select {
		case err := <-done:
			t.Fatalf("the stream ended (%v) before the router's leaf rotated: it proves nothing", err)
		default:
		}
		must.NoError(t, <-done)
		must.StrHasSuffix(t, "data: [DONE]\n\n", body)
		must.StrNotContains(t, body, `"error"`)
		must.GreaterEq(t, tokens, strings.Count(body, "data: "), must.Sprint("every token arrived"))
		// New connections work with the new leaves.
		testutil.Eventually(t, 60*time.Second, "a request on a new connection", func() bool {
			fresh := meshClient(meshIdentity(t, ctx, "oasis-client"), "oasis-router")
			code, _, err := meshChat(ctx, fresh, base, "after rotation", 4, false)
			return err == nil && code == http.StatusOK
		})
	})
}

// routerMetric is the value of one series on the router's /metrics (-1 when absent).
func routerMetric(ctx context.Context, c *http.Client, base, series string) float64 {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	if err != nil {
		return -1
	}
	resp, err := c.Do(req)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

// meshChat posts a chat completion and returns its status and body.
func meshChat(ctx context.Context, c *http.Client, base, prompt string, maxTokens int, stream bool) (int, string, error) {
	body := fmt.Sprintf(`{"model":"tiny-sim","max_tokens":%d,"stream":%t,"messages":[{"role":"user","content":%q}]}`,
		maxTokens, stream, prompt)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// sharedPrefixBurst sends a request with a long system prompt, then more sharing it, and
// reads the engines' own prefix-cache counters through their sidecars (as the router: only
// it may call engines): the burst's hits land on the engine that holds the prefix.
func sharedPrefixBurst(t *testing.T, ctx context.Context, client *http.Client, base string) {
	asRouter := meshClient(meshIdentity(t, ctx, "oasis-router"), "oasis-engine")
	before := engineHits(t, ctx, asRouter)
	var system strings.Builder
	for i := 0; system.Len() < 3000; i++ {
		fmt.Fprintf(&system, "Rule %d of the mesh assistant: answer precisely, cite the policy, never guess. ", i)
	}
	ask := func(q string) {
		body := fmt.Sprintf(`{"model":"tiny-sim","max_tokens":4,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}]}`,
			system.String(), q)
		resp, err := client.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		must.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		must.EqOp(t, http.StatusOK, resp.StatusCode)
	}
	const matched = `oasis_router_prefix_matched_blocks_total{model="tiny-sim"}`
	matchedBefore := max(0, routerMetric(ctx, client, base, matched))
	ask("warm-up question")
	// The holder's KV events have reached the router once a request sharing
	// the prefix is routed on blocks the router's index holds.
	probes := 0
	testutil.EventuallyEvery(t, 30*time.Second, 200*time.Millisecond, "a request routed on the warm-up's indexed blocks", func() bool {
		probes++
		ask(fmt.Sprintf("probe question %d", probes))
		return routerMetric(ctx, client, base, matched) > matchedBefore
	})
	t.Logf("the router matched the warm-up's blocks after %d probe(s)", probes)
	const n = 8
	for i := range n {
		ask(fmt.Sprintf("question number %d", i))
	}
	after := engineHits(t, ctx, asRouter)
	var total, most float64
	for id, h := range after {
		d := h - before[id]
		total += d
		most = max(most, d)
	}
	t.Logf("prefix-cache hit tokens per engine: before %v, after %v", before, after)
	must.Positive(t, total)
	must.GreaterEq(t, 0.85*total, most, must.Sprint("the burst's hits are on one engine: the holder"))
}

// engineHits reads each engine's vllm:prefix_cache_hits_total through its sidecar.
func engineHits(t *testing.T, ctx context.Context, c *http.Client) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for id, addr := range meshEndpoints(t, testbed.MeshServiceName) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+addr+"/metrics", nil)
		must.NoError(t, err)
		resp, err := c.Do(req)
		must.NoError(t, err)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "vllm:prefix_cache_hits_total"); ok {
				f, err := strconv.ParseFloat(strings.TrimSpace(v[strings.LastIndex(v, "}")+1:]), 64)
				must.NoError(t, err)
				out[id] += f
			}
		}
		resp.Body.Close()
	}
	return out
}
