package faults

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// TestKvcachedMeshIntentionRevoked runs jobs/kvcached.nomad.hcl with mesh = true on the test bed
// (ACLs on, default deny, the job's role from jobs/acl/setup.sh) and a second kvcached outside
// Nomad with --mesh and a token of the same role. The job's kvcached takes its Connect leaf with
// what Nomad injects into a Connect-native task (CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN); the outside
// one fetches a block from it once an intention allows oasis-kvcached to oasis-kvcached. The
// fault: the intention turns to deny while the peers' connection is open; fetches must stop
// within deniedWithin, and come back once it allows again.
func TestKvcachedMeshIntentionRevoked(t *testing.T) {
	const deniedWithin = 5 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	setKvcachedIntention(t, consulapi.IntentionActionAllow)
	kv := runKvcachedVars(t, ctx, map[string]string{"peers_enabled": "true", "mesh": "true"})
	// Registered Connect-native: the catalog's Connect view lists the instance itself.
	native, _, err := stack.Consul.Catalog().Connect("oasis-kvcached", "", nil)
	must.NoError(t, err)
	must.Len(t, 1, native)
	must.EqOp(t, "oasis-kvcached", native[0].ServiceName)

	token, err := stack.ConsulRoleToken("oasis-kvcached")
	must.NoError(t, err)
	out := startMeshKvcached(t, token)
	job := redis.NewClient(&redis.Options{Addr: kv.addr})
	defer job.Close()
	for i := range 200 {
		must.NoError(t, job.Set(ctx, meshKey(i), "block "+strconv.Itoa(i), 0).Err())
	}
	next := 0
	fetch := func() bool {
		i := next
		next++
		v, err := out.Get(ctx, meshKey(i)).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("GET: %v", err)
		}
		return v == "block "+strconv.Itoa(i)
	}
	testutil.EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "a block fetched from the peer across the mesh", fetch)
	must.StrContains(t, scrape(t, kv.httpAddr), `oasis_mesh_authorizations_total{cached="false",result="allowed"}`)
	taskLog, err := stack.TaskLog(ctx, kv.allocID, "kvcached", "stderr")
	must.NoError(t, err)
	must.StrContains(t, taskLog, "peer identity from Consul Connect")

	t0 := time.Now()
	setKvcachedIntention(t, consulapi.IntentionActionDeny)
	for fetch() {
		must.Less(t, deniedWithin, time.Since(t0))
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("deny intention written (call started) to first refused fetch: %s", time.Since(t0))
	must.StrContains(t, scrape(t, kv.httpAddr), "oasis_kvcached_peer_connections_denied_total 1")

	t0 = time.Now()
	setKvcachedIntention(t, consulapi.IntentionActionAllow)
	testutil.EventuallyEvery(t, 30*time.Second, 20*time.Millisecond, "fetches served again after the allow intention", fetch)
	t.Logf("allow intention written (call started) to first fetch served: %s", time.Since(t0))
}

func meshKey(i int) string { return "mesh@" + strconv.Itoa(i) + "@kv_bytes" }

func setKvcachedIntention(t *testing.T, action consulapi.IntentionAction) {
	t.Helper()
	if action == consulapi.IntentionActionAllow {
		testutil.SetIntentions(t, stack.Consul, "oasis-kvcached", "oasis-kvcached")
	} else {
		testutil.SetIntentions(t, stack.Consul, "oasis-kvcached")
	}
	t.Cleanup(func() { _, _ = stack.Consul.ConfigEntries().Delete(consulapi.ServiceIntentions, "oasis-kvcached", nil) })
}

// startMeshKvcached runs oasis-kvcached with --mesh outside Nomad, finding the job's instance in
// Consul, and returns a Redis client of it.
func startMeshKvcached(t *testing.T, token string) *redis.Client {
	t.Helper()
	addr, httpAddr := testutil.FreeAddr(t), testutil.FreeAddr(t)
	ports, err := testutil.FreePorts(1)
	must.NoError(t, err)
	quic := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	cmd := exec.Command(stack.Bin("oasis-kvcached"), "--addr", addr, "--http-addr", httpAddr, "--ram-bytes", "64MiB",
		"--mesh", "--quic-addr", quic, "--quic-advertise", quic, "--consul-addr", stack.ConsulAddr,
		"--peer-filter-interval", "200ms", "--log-level", "debug")
	cmd.Env = append(cmd.Environ(), "CONSUL_HTTP_TOKEN="+token)
	p := testutil.Start(t, cmd)
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if p.Exited() {
			return wait.ErrTimeoutExceeded
		}
		return c.Ping(context.Background()).Err()
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)))
	return c
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	must.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must.NoError(t, err)
	return strings.TrimSpace(string(b))
}
