package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// Graceful drain (issue #37): Nomad stopping an engine task (a rolling
// update, `nomad alloc stop`) costs no client request. The service goes from
// Consul first (the router drops the engine), the group's shutdown_delay
// passes, then the llm driver's StopTask waits for the engine's own
// running+waiting counts to reach zero before it signals it.

// drainPolicy retries a request not yet streaming elsewhere, as in the other
// fault tests.
const drainPolicy = `{"policy":"round_robin","timeouts":{"response_header":"3s","stream_idle":"2s","first_token_hold":"1s"}}`

// drainJob is a job of n oasis-sim engines as a recipe runs them: one group,
// a rolling update one allocation at a time, shutdown_delay, and a
// kill_timeout the drain may use. args are the engine's extra_args: changing
// them is a destructive update.
func drainJob(id, model string, n int, shutdownDelay, args string) string {
	hcl := testbed.SimEngine{ID: id, Model: model, Config: `extra_args = [` + args + `]`}.HCL()
	group := fmt.Sprintf(`group "engine" {
    count          = %d
    shutdown_delay = %q
    update {
      max_parallel     = 1
      health_check     = "checks"
      min_healthy_time = "2s"
      healthy_deadline = "1m"
    }`, n, shutdownDelay)
	hcl = strings.Replace(hcl, `group "engine" {`, group, 1)
	return strings.Replace(hcl, `kill_timeout = "5s"`, `kill_timeout = "30s"`, 1)
}

const drainArgs = `"--step-time-base", "40ms", "--step-time-per-prefill-token", "500us"`

// startDrainJob runs the job, waits until n engines pass in Consul and a
// router routes to them, and starts the load.
func startDrainJob(t *testing.T, job, model, shutdownDelay string) (*routerProc, *load) {
	t.Helper()
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	_, err := stack.RunJobHCL(ctx, drainJob(job, model, n, shutdownDelay, drainArgs))
	must.NoError(t, err)
	t.Cleanup(func() { stopEngines(t, model, []*engine{{job: job}}) })
	must.NoError(t, stack.WaitDeployment(ctx, job))
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "n passing instances of the model in Consul", func() bool {
		return len(viewConsul(t, model).passing) == n
	})
	r := startRouter(t, model, drainPolicy, n)
	l := startLoad(t, loadConfig{url: r.url, model: model, clients: loadClients, deadline: requestDeadline})
	waitResults(t, l, 2*loadClients)
	return r, l
}

// waitDeployed waits until the deployment of the job's version succeeded.
func waitDeployed(t *testing.T, ctx context.Context, job string, version uint64) {
	t.Helper()
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		d, _, err := stack.Nomad.Jobs().LatestDeployment(job, (&nomadapi.QueryOptions{}).WithContext(ctx))
		switch {
		case err != nil:
			return err
		case d == nil || d.JobVersion != version:
			return fmt.Errorf("no deployment of version %d yet", version)
		case d.Status == nomadapi.DeploymentStatusFailed || d.Status == nomadapi.DeploymentStatusCancelled:
			t.Fatalf("deployment of %s version %d %s: %s", job, version, d.Status, d.StatusDescription)
		case d.Status != nomadapi.DeploymentStatusSuccessful:
			return fmt.Errorf("deployment %s", d.Status)
		}
		return nil
	}), wait.Timeout(4*time.Minute), wait.Gap(500*time.Millisecond)))
}

// waitResults waits until the load has finished n requests, all of them ok.
func waitResults(t *testing.T, l *load, n int) {
	t.Helper()
	testutil.EventuallyEvery(t, time.Minute, 100*time.Millisecond, "the load to finish n requests", func() bool {
		return len(l.snapshot()) >= n
	})
}

// assertNoneFailed checks that every request of the load ended ok: no lost
// request and no clean error either.
func assertNoneFailed(t *testing.T, rs []result) tally {
	t.Helper()
	all := count(rs)
	t.Logf("load: %s", all)
	for _, r := range rs {
		if r.outcome != outcomeOK {
			t.Errorf("failed request: %s", r)
		}
	}
	must.Zero(t, all.lost+all.clean, must.Sprint("failed client requests"))
	return all
}

// drainEvents returns the llm driver's drain events of an allocation's
// engine task.
func drainEvents(t *testing.T, allocID string) []string {
	t.Helper()
	a, _, err := stack.Nomad.Allocations().Info(allocID, nil)
	must.NoError(t, err)
	var out []string
	if ts := a.TaskStates["engine"]; ts != nil {
		for _, ev := range ts.Events {
			if strings.HasPrefix(ev.DisplayMessage, "Drain") {
				out = append(out, ev.DisplayMessage)
			}
		}
	}
	return out
}

// TestRollingUpdateUnderLoad rolls a changed engine job (max_parallel 1,
// shutdown_delay 1 s) over three engines while the router serves a steady
// load of streamed and whole requests.
//
// Lost: nothing. Asserted: zero failed client requests (no lost request, no
// error event), every old allocation stopped and three new ones passing.
func TestRollingUpdateUnderLoad(t *testing.T) {
	const job, model = "drain-roll", "drain-roll-llama"
	_, l := startDrainJob(t, job, model, "1s")
	old, _, err := stack.Nomad.Jobs().Allocations(job, false, nil)
	must.NoError(t, err)

	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	start := time.Now()
	_, err = stack.RunJobHCL(ctx, drainJob(job, model, 3, "1s", `"--step-time-base", "41ms", "--step-time-per-prefill-token", "500us"`))
	must.NoError(t, err)
	info, _, err := stack.Nomad.Jobs().Info(job, nil)
	must.NoError(t, err)
	waitDeployed(t, ctx, job, *info.Version)
	t.Logf("rolling update of 3 engines took %s", time.Since(start).Round(time.Millisecond))
	before := len(l.snapshot())
	waitResults(t, l, before+loadClients)
	rs := l.Stop()

	for _, a := range old {
		info, _, err := stack.Nomad.Allocations().Info(a.ID, nil)
		must.NoError(t, err)
		must.EqOp(t, "complete", info.ClientStatus, must.Sprint("old allocation ", a.ID[:8]))
		t.Logf("old allocation %s: %v", a.ID[:8], drainEvents(t, a.ID))
	}
	must.Len(t, 3, viewConsul(t, model).passing)
	assertNoneFailed(t, rs)
}

// TestAllocStopUnderLoad stops (`nomad alloc stop`) one of three engines
// with no shutdown_delay while streams run on it: only the driver's drain
// keeps them. Nomad replaces the allocation.
//
// Lost: nothing. Asserted: zero failed client requests; the driver reported
// the drain on the stopped task ("Draining: N requests in flight", then
// "Drained"), so the requests on it ran to completion before the signal.
func TestAllocStopUnderLoad(t *testing.T) {
	const job, model = "drain-stop", "drain-stop-llama"
	r, l := startDrainJob(t, job, model, "0s")
	allocs, _, err := stack.Nomad.Jobs().Allocations(job, false, nil)
	must.NoError(t, err)
	victim := allocs[0].ID

	// Stop it while the router has requests in flight on it.
	testutil.EventuallyEvery(t, 30*time.Second, 10*time.Millisecond, "two requests in flight on the victim", func() bool {
		m, err := r.metrics()
		return err == nil && m.sum("oasis_router_worker_in_flight", victim) >= 2
	})
	_, err = stack.Nomad.Allocations().Stop(&nomadapi.Allocation{ID: victim}, nil)
	must.NoError(t, err)

	var events []string
	testutil.EventuallyEvery(t, time.Minute, 200*time.Millisecond, "the stopped allocation to complete", func() bool {
		a, _, err := stack.Nomad.Allocations().Info(victim, nil)
		if err != nil || a.ClientStatus != "complete" {
			return false
		}
		events = drainEvents(t, victim)
		return true
	})
	t.Logf("stopped allocation %s: %v", victim[:8], events)
	testutil.EventuallyEvery(t, time.Minute, 200*time.Millisecond, "three passing instances of the model in Consul", func() bool {
		return len(viewConsul(t, model).passing) == 3
	})
	before := len(l.snapshot())
	waitResults(t, l, before+loadClients)
	rs := l.Stop()

	assertNoneFailed(t, rs)
	must.SliceNotEmpty(t, events, must.Sprint("no drain event on the stopped task"))
	must.StrHasPrefix(t, "Draining: ", events[0])
	must.StrHasPrefix(t, "Drained", events[len(events)-1])
}

// startSecondClient runs a second Nomad client on this host, joined to the
// stack's server with the stack's own agent configuration (Consul, ACLs,
// plugins) but its own name, data dir, ports and dynamic port range. It is
// stopped when the test ends, after the test's jobs (registered later).
func startSecondClient(t *testing.T, ctx context.Context, name string) *nomadapi.Node {
	t.Helper()
	own, err := os.ReadFile(filepath.Join(stack.Dir, "nomad.hcl"))
	must.NoError(t, err)
	rpc, err := stack.NomadServerRPC()
	must.NoError(t, err)
	ports, err := testutil.FreePorts(3)
	must.NoError(t, err)
	// Short: Nomad puts unix sockets under the data dir.
	dir, err := os.MkdirTemp("", "odrain")
	must.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	dataDir := filepath.Join(dir, "d")

	// Its own Consul client agent: Nomad clients sharing one agent deregister each other's
	// services (each removes the Nomad services it does not know).
	consulAddr := startConsulClient(t, dir, name)

	cfg := string(own)
	cfg = regexp.MustCompile(`(?m)^(\s*address\s*=\s*)"`+regexp.QuoteMeta(stack.ConsulAddr)+`"`).ReplaceAllString(cfg, `${1}"`+consulAddr+`"`)
	must.StrContains(t, cfg, consulAddr, must.Sprint("no consul address in the stack's nomad.hcl"))
	replaceBlock := func(start, with string) {
		i := strings.Index(cfg, start)
		must.Positive(t, i+1, must.Sprint("no ", start, " in the stack's nomad.hcl"))
		j := strings.Index(cfg[i:], "\n}\n")
		cfg = cfg[:i] + with + cfg[i+j+3:]
	}
	replaceBlock("ports {", fmt.Sprintf("ports {\n  http = %d\n  rpc  = %d\n  serf = %d\n}\n", ports[0], ports[1], ports[2]))
	replaceBlock("advertise {", fmt.Sprintf("advertise {\n  http = \"127.0.0.1:%d\"\n  rpc  = \"127.0.0.1:%d\"\n  serf = \"127.0.0.1:%d\"\n}\n", ports[0], ports[1], ports[2]))
	replaceBlock("server {", "server {\n  enabled = false\n}\n")
	cfg = regexp.MustCompile(`(?m)^name\s*=.*$`).ReplaceAllString(cfg, fmt.Sprintf("name = %q", name))
	cfg = regexp.MustCompile(`(?m)^data_dir\s*=.*$`).ReplaceAllString(cfg, fmt.Sprintf("data_dir = %q", dataDir))
	// The stack's own dynamic port window is the stack's (testbed/ports.go), not this client's.
	cfg = regexp.MustCompile(`(?m)^  (min|max)_dynamic_port\s*=.*\n`).ReplaceAllString(cfg, "")
	cfg = regexp.MustCompile(`(?m)^  servers\s*=.*$`).ReplaceAllString(cfg,
		fmt.Sprintf("  servers = [%q]\n  # The stack's clients allocate from 20000-31999 on the same address; the kernel's ephemeral ports end at 60999.\n  min_dynamic_port = 61000\n  max_dynamic_port = 61999", rpc))
	// Engines run as an unprivileged user in task dirs under the data dir.
	must.NoError(t, os.Chmod(dir, 0o755))
	must.NoError(t, os.MkdirAll(dataDir, 0o755))
	cfgPath := filepath.Join(dir, "nomad.hcl")
	must.NoError(t, os.WriteFile(cfgPath, []byte(cfg), 0o600))

	// The Nomad the stack runs (testbed: OASIS_NOMAD_BIN, else bin/nomad).
	nomadBin := os.Getenv("OASIS_NOMAD_BIN")
	if nomadBin == "" {
		root, err := testbed.RepoRoot()
		must.NoError(t, err)
		nomadBin = filepath.Join(root, "bin", "nomad")
	}
	agent, err := testbed.StartExtraAgent(nomadBin, []string{"agent", "-config", cfgPath}, dir, filepath.Join(dir, "nomad.log"), dataDir)
	must.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("second client log:\n%s", agent.Tail())
		}
		if err := agent.Stop(); err != nil {
			t.Errorf("stopping the second nomad client: %v", err)
		}
		if nodes, _, err := stack.Nomad.Nodes().PrefixList(""); err == nil {
			for _, nd := range nodes {
				if nd.Name == name {
					_, _, _ = stack.Nomad.Nodes().Purge(nd.ID, nil)
				}
			}
		}
	})
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	node, err := stack.WaitNomadNode(wctx, agent, name)
	must.NoError(t, err)
	return node
}

// TestNodeDrainUnderLoad drains (`nomad node drain -enable`) a second Nomad
// client running engines of a job spread over two nodes, while the router
// serves a steady load. Nomad migrates them (the group's migrate defaults:
// one at a time) to the other node; each leaves Consul, waits its
// shutdown_delay, and the driver drains it before the signal.
//
// Lost: nothing. Asserted: zero failed client requests; the drained node
// runs no engine afterwards and four pass again, all on the other node.
func TestNodeDrainUnderLoad(t *testing.T) {
	const job, model, n = "drain-node", "drain-node-llama", 4
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	second := startSecondClient(t, ctx, "oasis-drain-e2e")

	hcl := drainJob(job, model, n, "1s", drainArgs)
	hcl = strings.Replace(hcl, `group "engine" {`, "group \"engine\" {\n    spread {\n      attribute = \"${node.unique.id}\"\n    }", 1)
	_, err := stack.RunJobHCL(ctx, hcl)
	must.NoError(t, err)
	t.Cleanup(func() { stopEngines(t, model, []*engine{{job: job}}) })
	must.NoError(t, stack.WaitDeployment(ctx, job))
	onSecond := func() []string {
		allocs, _, err := stack.Nomad.Jobs().Allocations(job, false, nil)
		must.NoError(t, err)
		var ids []string
		for _, a := range allocs {
			if a.NodeID == second.ID && a.ClientStatus == "running" {
				ids = append(ids, a.ID)
			}
		}
		return ids
	}
	drained := onSecond()
	must.SliceNotEmpty(t, drained, must.Sprint("no engine placed on the second node"))
	testutil.EventuallyEvery(t, 60*time.Second, 200*time.Millisecond, "n passing instances of the model in Consul", func() bool {
		return len(viewConsul(t, model).passing) == n
	})
	r := startRouter(t, model, drainPolicy, n)
	l := startLoad(t, loadConfig{url: r.url, model: model, clients: loadClients, deadline: requestDeadline})
	waitResults(t, l, 2*loadClients)

	start := time.Now()
	_, err = stack.Nomad.Nodes().UpdateDrain(second.ID, &nomadapi.DrainSpec{Deadline: 2 * time.Minute}, false, nil)
	must.NoError(t, err)
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		nd, _, err := stack.Nomad.Nodes().Info(second.ID, nil)
		switch {
		case err != nil:
			return err
		case nd.DrainStrategy != nil:
			return fmt.Errorf("node %s still draining", second.ID[:8])
		case len(onSecond()) > 0:
			return fmt.Errorf("engines still on node %s", second.ID[:8])
		case len(viewConsul(t, model).passing) != n:
			return fmt.Errorf("not %d engines passing", n)
		}
		return nil
	}), wait.Timeout(4*time.Minute), wait.Gap(250*time.Millisecond)))
	t.Logf("drained %d engines off node %s in %s", len(drained), second.ID[:8], time.Since(start).Round(time.Millisecond))
	for _, id := range drained {
		t.Logf("drained allocation %s: %v", id[:8], drainEvents(t, id))
	}
	before := len(l.snapshot())
	waitResults(t, l, before+loadClients)
	rs := l.Stop()
	assertNoneFailed(t, rs)
}

// startConsulClient runs a Consul client agent called name joined to the
// stack's Consul, data under dir, and returns its HTTP address; it is stopped
// when the test ends, after the Nomad client registered later.
func startConsulClient(t *testing.T, dir, name string) string {
	t.Helper()
	join, err := stack.ConsulSerfLAN()
	must.NoError(t, err)
	agentToken, _, err := stack.ClientTokens()
	must.NoError(t, err)
	ports, err := testutil.FreePorts(2)
	must.NoError(t, err)
	cfg := map[string]any{
		"node_name": name, "bind_addr": "127.0.0.1", "client_addr": "127.0.0.1", "log_level": "warn",
		"data_dir": filepath.Join(dir, "consul"), "server": false, "retry_join": []string{join},
		"ports": map[string]int{"http": ports[0], "serf_lan": ports[1], "serf_wan": -1, "dns": -1,
			"grpc": -1, "grpc_tls": -1, "https": -1},
	}
	if agentToken != "" {
		cfg["acl"] = map[string]any{"enabled": true, "default_policy": "deny", "tokens": map[string]string{"agent": agentToken}}
	}
	data, err := json.Marshal(cfg)
	must.NoError(t, err)
	path := filepath.Join(dir, "consul.json")
	must.NoError(t, os.WriteFile(path, data, 0o600))
	consulBin := os.Getenv("OASIS_CONSUL_BIN")
	if consulBin == "" {
		root, err := testbed.RepoRoot()
		must.NoError(t, err)
		consulBin = filepath.Join(root, "bin", "consul")
	}
	agent, err := testbed.StartExtraAgent(consulBin, []string{"agent", "-config-file", path}, dir, filepath.Join(dir, "consul.log"), "")
	must.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("second consul agent log:\n%s", agent.Tail())
		}
		if err := agent.Stop(); err != nil {
			t.Errorf("stopping the second consul agent: %v", err)
		}
	})
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if agent.Exited() {
			return fmt.Errorf("consul agent exited:\n%s", agent.Tail())
		}
		node, _, err := stack.Consul.Catalog().Node(name, nil)
		if err != nil {
			return err
		}
		if node == nil {
			return fmt.Errorf("no catalog node %s yet", name)
		}
		return nil
	}), wait.Timeout(time.Minute), wait.Gap(250*time.Millisecond)))
	return fmt.Sprintf("127.0.0.1:%d", ports[0])
}
