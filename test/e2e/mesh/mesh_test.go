// Package mesh runs llm-driver engines in Nomad bridge networking with Consul Connect sidecars
// on the real agents, ACLs on: the engine answers on its mapped port, a Connect client reaches a
// loopback-only engine through its sidecar over mTLS, and intentions decide who may call it.
package mesh

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var stack *testbed.Stack

func TestMain(m *testing.M) {
	os.Exit(testbed.Main(m, testbed.Options{Bridge: true}, &stack))
}

// client opens a new connection per request: a sidecar authorizes connections, not requests.
var client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// chat posts a chat completion and returns the status and body (or the transport error).
func chat(addr string) (int, string, error) {
	body := `{"model":"llama","messages":[{"role":"user","content":"Say hello"}],"max_tokens":4}`
	resp, err := client.Post("http://"+addr+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func mustChat(t *testing.T, addr string) {
	t.Helper()
	code, body, err := chat(addr)
	must.NoError(t, err)
	must.EqOp(t, http.StatusOK, code, must.Sprint(body))
	must.StrContains(t, body, `"choices"`)
}

// runMesh starts a mesh engine job and waits for it and its sidecar to pass in Consul.
func runMesh(t *testing.T, ctx context.Context, e testbed.MeshSimEngine) (allocID string, addr string) {
	t.Helper()
	_, err := stack.RunJobHCL(ctx, e.HCL())
	must.NoError(t, err, must.Sprint(e.HCL()))
	t.Cleanup(func() { _ = stack.StopJob(context.Background(), e.ID) })
	allocs, err := stack.WaitAllocsRunning(ctx, e.ID)
	must.NoError(t, err, must.Sprint(stack.NomadLog()))
	must.Len(t, 1, allocs)
	entries, err := stack.WaitMeshPassing(ctx, 1)
	must.NoError(t, err, must.Sprint(meshDiagnosis(allocs[0].ID)))
	for _, se := range entries {
		if se.Service.ID == testbed.MeshServiceID(allocs[0].ID) {
			return allocs[0].ID, fmt.Sprintf("%s:%d", se.Service.Address, se.Service.Port)
		}
	}
	t.Fatalf("no %s service with id %s among %d passing", testbed.MeshServiceName, testbed.MeshServiceID(allocs[0].ID), len(entries))
	return "", ""
}

// meshDiagnosis is what a failed wait for the mesh shows: the sidecar's checks and its log.
func meshDiagnosis(allocID string) string {
	var b strings.Builder
	checks, _, err := stack.Consul.Health().Service(testbed.MeshServiceName+"-sidecar-proxy", "", false, nil)
	fmt.Fprintf(&b, "sidecar service entries (err %v):\n", err)
	for _, e := range checks {
		for _, c := range e.Checks {
			fmt.Fprintf(&b, "  %s %s: %s\n", c.Name, c.Status, c.Output)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, stream := range []string{"stdout", "stderr"} {
		out, err := stack.TaskLog(ctx, allocID, "connect-proxy-"+testbed.MeshServiceName, stream)
		fmt.Fprintf(&b, "sidecar %s (err %v):\n%s\n", stream, err, out)
	}
	return b.String()
}

// TestBridgeEngineMappedPort: an engine in bridge networking binds the port's "to" inside its
// namespace, is healthy in Consul (checked from the host through the mapped port) and answers
// there; its sidecar forwards to that in-namespace port.
func TestBridgeEngineMappedPort(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	e := stack.MeshSimEngine(testbed.SimEngine{ID: "mesh-open", KVEvents: true})
	allocID, addr := runMesh(t, ctx, e)
	mustChat(t, addr)
	must.StrNotContains(t, addr, fmt.Sprintf(":%d", testbed.MeshEnginePort), must.Sprint("the service should advertise the host side of the mapping"))

	// KV events: the kv port has no "to", so the engine binds its host number inside and the
	// advertised host address reaches the publisher through the mapping.
	svc, _, err := stack.Consul.Agent().Service(testbed.MeshServiceID(allocID), nil)
	must.NoError(t, err)
	kv := strings.TrimPrefix(svc.Meta["oasis_kv_events"], "tcp://")
	conn, err := net.DialTimeout("tcp", kv, 5*time.Second)
	must.NoError(t, err, must.Sprint("KV events publisher at ", kv))
	conn.Close()

	sidecar, _, err := stack.Consul.Agent().Service(testbed.MeshServiceID(allocID)+"-sidecar-proxy", nil)
	must.NoError(t, err)
	must.EqOp(t, testbed.MeshEnginePort, sidecar.Proxy.LocalServicePort)
	stopAndWait(t, ctx, e.ID)
}

// TestConnectThroughSidecar: a loopback-only engine is reachable only through its sidecar; a
// Connect client (its own identity and leaf certificate) reaches it when an intention allows it
// and not otherwise (the test bed's ACL default is deny).
func TestConnectThroughSidecar(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := stack.MeshSimEngine(testbed.SimEngine{ID: "mesh-engine"})
	e.LoopbackOnly = true
	allocID, mapped := runMesh(t, ctx, e)
	// The driver probes health from inside the namespace, where the engine listens.
	must.NoError(t, engineReady(ctx, allocID))

	_, _, err := chat(mapped)
	must.Error(t, err, must.Sprint("a loopback-only engine answered on its mapped port ", mapped))
	t.Logf("mapped port %s of the loopback-only engine: %v", mapped, err)

	const source = "oasis-mesh-client"
	upstream, stop, err := stack.ConnectUpstream(ctx, source)
	must.NoError(t, err)
	defer stop()

	// No intention yet: the ACL default (deny) decides.
	mustFail(t, ctx, upstream, "without an intention")
	must.NoError(t, stack.SetIntention(ctx, source, "allow"))
	mustAnswer(t, ctx, upstream, "after allow")
	must.NoError(t, stack.SetIntention(ctx, source, "deny"))
	mustFail(t, ctx, upstream, "after deny")
	must.NoError(t, stack.SetIntention(ctx, source, "allow"))
	mustAnswer(t, ctx, upstream, "after allow again")
	stopAndWait(t, ctx, e.ID)
}

// TestSidecarLatency measures what the mesh adds to a request: /health on the mapped port of an
// engine (no proxy) against /health through the Connect client and the engine's sidecar (two
// L4 proxies and mTLS). It asserts only that both answer; the figures go to the log.
func TestSidecarLatency(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := stack.MeshSimEngine(testbed.SimEngine{ID: "mesh-latency"})
	_, mapped := runMesh(t, ctx, e)
	const source = "oasis-latency-client"
	must.NoError(t, stack.SetIntention(ctx, source, "allow"))
	upstream, stop, err := stack.ConnectUpstream(ctx, source)
	must.NoError(t, err)
	defer stop()
	must.NoError(t, answersWithin(ctx, upstream, 30*time.Second))

	kept := &http.Client{Timeout: 10 * time.Second}
	for _, c := range []struct {
		name   string
		client *http.Client
	}{{"new connection each", client}, {"kept-alive connection", kept}} {
		direct, err := healthLatencies(c.client, mapped, 200)
		must.NoError(t, err)
		mesh, err := healthLatencies(c.client, upstream, 200)
		must.NoError(t, err)
		t.Logf("GET /health p50 / p90 (%s): mapped port %v / %v, through the mesh %v / %v", c.name,
			direct[len(direct)/2], direct[len(direct)*9/10], mesh[len(mesh)/2], mesh[len(mesh)*9/10])
	}
	stopAndWait(t, ctx, e.ID)
}

func healthLatencies(client *http.Client, addr string, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		resp, err := client.Get("http://" + addr + "/health")
		if err != nil {
			return nil, err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return nil, fmt.Errorf("GET %s/health: %s", addr, resp.Status)
		}
		out = append(out, time.Since(start))
	}
	slices.Sort(out)
	return out, nil
}

func mustAnswer(t *testing.T, ctx context.Context, addr, when string) {
	t.Helper()
	must.NoError(t, answersWithin(ctx, addr, 30*time.Second), must.Sprint(when))
	mustChat(t, addr)
}

func mustFail(t *testing.T, ctx context.Context, addr, when string) {
	t.Helper()
	must.NoError(t, failsWithin(ctx, addr, 30*time.Second), must.Sprint(when))
	code, body, err := chat(addr)
	t.Logf("%s: status %d, body %q, error %v", when, code, body, err)
}

// engineReady waits for the driver's "Engine ready" event on the engine task.
func engineReady(ctx context.Context, allocID string) error {
	return waitUntil(ctx, 30*time.Second, func() error {
		alloc, _, err := stack.Nomad.Allocations().Info(allocID, nil)
		if err != nil {
			return err
		}
		var events []string
		if st := alloc.TaskStates["engine"]; st != nil {
			for _, ev := range st.Events {
				if strings.HasPrefix(ev.DisplayMessage, "Engine ready after") {
					return nil
				}
				events = append(events, ev.DisplayMessage)
			}
		}
		return fmt.Errorf("no \"Engine ready\" event on task engine of %s; events: %q", allocID, events)
	})
}

// waitUntil polls cond every 200 ms until it returns nil or d passes (then
// it returns cond's last error); ctx ending is an error of its own.
func waitUntil(ctx context.Context, d time.Duration, cond func() error) error {
	return wait.InitialSuccess(wait.ErrorFunc(func() error {
		if err := ctx.Err(); err != nil {
			return err
		}
		return cond()
	}), wait.Timeout(d), wait.Gap(200*time.Millisecond)).Run()
}

// answersWithin polls until a chat completion through addr succeeds: intentions reach the
// sidecar's agent cache asynchronously.
func answersWithin(ctx context.Context, addr string, d time.Duration) error {
	return waitUntil(ctx, d, func() error {
		code, body, err := chat(addr)
		if err == nil && code == http.StatusOK {
			return nil
		}
		return fmt.Errorf("no answer through %s within %s: last status %d, body %q, error %v", addr, d, code, body, err)
	})
}

// failsWithin polls until a chat completion through addr fails, then checks that it keeps
// failing for a second (a refused mTLS handshake closes the connection the client opened).
func failsWithin(ctx context.Context, addr string, d time.Duration) error {
	err := waitUntil(ctx, d, func() error {
		if code, _, err := chat(addr); err == nil && code == http.StatusOK {
			return fmt.Errorf("calls through %s still answered after %s", addr, d)
		}
		return nil
	})
	if err != nil {
		return err
	}
	// And the calls keep failing for a second, sampled every 200 ms.
	return wait.ContinualSuccess(wait.ErrorFunc(func() error {
		if code, body, err := chat(addr); err == nil && code == http.StatusOK {
			return fmt.Errorf("a call through %s failed, then answered again: %s", addr, body)
		}
		return nil
	}), wait.Timeout(time.Second), wait.Gap(200*time.Millisecond)).Run()
}

func stopAndWait(t *testing.T, ctx context.Context, jobID string) {
	t.Helper()
	must.NoError(t, stack.StopJob(ctx, jobID))
}
