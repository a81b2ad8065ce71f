package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/kvcached/peer"
)

// TestPeersInAnotherDatacenter runs two WAN-federated Consul datacenters
// and three kvcached: a and n in dc1 (a lists dc2 in --peer-datacenters, n
// does not), b in dc2. A block held only by b is fetched by a, not by n; a's
// byte budget for dc2 caps what a burst of fetches pulls; and with dc2's
// Consul frozen, a's local lookups and local discovery go on while dc2 is
// marked stale within its discovery timeout.
func TestPeersInAnotherDatacenter(t *testing.T) {
	dc1, dc2 := testutil.StartConsulWAN(t)
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "oasis test CA")
	caFile, cert, key := ca.WriteFiles(t, dir, "node", peer.DefaultServerName)
	const rate = 256 << 10
	const discoveryTimeout = 1500 * time.Millisecond
	node := func(consul *testutil.ConsulAgent, extra ...string) (*proc, string) {
		q := testutil.FreeAddr(t)
		args := append([]string{"--quic-addr", q, "--quic-advertise", q, "--tls-ca", caFile, "--tls-cert", cert, "--tls-key", key,
			"--peer-filter-interval", "200ms", "--peer-timeout", "1s", "--consul-addr", consul.HTTPAddr}, extra...)
		p := start(t, args...)
		rp, _ := strconv.Atoi(port(t, p.addr))
		qp, _ := strconv.Atoi(port(t, q))
		must.NoError(t, consul.Client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: "kvcached-" + q, Name: "oasis-kvcached", Address: "127.0.0.1", Port: rp,
			Meta: map[string]string{peer.QUICPortMeta: strconv.Itoa(qp)},
		}))
		return p, "kvcached-" + q
	}
	a, _ := node(dc1, "--peer-datacenters", "dc2", "--peer-wan-timeout", "2s",
		"--peer-wan-bytes-per-second", strconv.Itoa(rate), "--peer-wan-discovery-timeout", discoveryTimeout.String())
	n, nID := node(dc1)
	b, _ := node(dc2)
	ctx := context.Background()
	seven := []byte("block seven, held in dc2 only")
	must.NoError(t, b.client.Set(ctx, blockKey(7), seven, 0).Err())

	// a's peers: n locally, b in dc2, both exchanging filters.
	waitFor(t, 30*time.Second, "a to see n and b", func() bool { return a.metric(t, "oasis_kvcached_peers_healthy") == 2 })
	waitFor(t, 30*time.Second, "n to see a", func() bool { return n.metric(t, "oasis_kvcached_peers_healthy") == 1 })
	// Two of b's filters, the second built after block 7 was written, have reached a.
	b.waitMore(t, filtersServed, 2, 10*time.Second)

	must.ErrorIs(t, n.client.Get(ctx, blockKey(7)).Err(), redis.Nil, must.Sprint("n fetched from dc2, which it does not list"))
	got, err := a.client.Get(ctx, blockKey(7)).Bytes()
	must.NoError(t, err)
	must.Eq(t, seven, got)
	must.Eq(t, 1.0, a.metric(t, `oasis_kvcached_peer_wan_fetches_total{dc="dc2",result="hit"}`))
	must.Eq(t, float64(len(seven)), a.metric(t, `oasis_kvcached_peer_wan_bytes_total{dc="dc2",kind="block"}`))
	must.Eq(t, 1.0, b.metric(t, `oasis_kvcached_peer_requests_served_total{op="get",result="hit"}`))

	t.Run("budget", func(t *testing.T) { wanBudget(t, a, b, rate) })
	t.Run("frozen dc2", func(t *testing.T) { frozenDC2(t, dc1, dc2, a, n, nID, discoveryTimeout) })
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, timeout, 50*time.Millisecond, what, cond)
}

// wanBudget reads ten 100 KiB blocks held only in dc2 as fast as a serves
// them: what a pulls stays within its bucket's burst plus the rate over the
// burst's duration, and the rest are skipped as misses, counted as budget.
func wanBudget(t *testing.T, a, b *proc, rate int) {
	ctx := context.Background()
	const blocks, size = 10, 100 << 10
	for i := range blocks {
		must.NoError(t, b.client.Set(ctx, blockKey(100+i), bytes.Repeat([]byte{byte(i)}, size), 0).Err())
	}
	// b's filter with the ten blocks reaches a. (a's bucket may not be full again: the bound
	// below holds whatever it held, and one 100 KiB block fits a refill of well under a second.)
	b.waitMore(t, filtersServed, 2, 10*time.Second)
	before := a.metric(t, `oasis_kvcached_peer_wan_bytes_total{dc="dc2",kind="block"}`)
	start := time.Now()
	hits := 0
	for i := range blocks {
		v, err := a.client.Get(ctx, blockKey(100+i)).Bytes()
		if err == nil {
			must.Eq(t, size, len(v))
			hits++
		} else {
			must.ErrorIs(t, err, redis.Nil)
		}
	}
	elapsed := time.Since(start)
	pulled := a.metric(t, `oasis_kvcached_peer_wan_bytes_total{dc="dc2",kind="block"}`) - before
	bound := float64(rate) + float64(rate)*elapsed.Seconds()
	t.Logf("%d of %d blocks of %d KiB fetched in %s: %.0f KiB pulled, bound %.0f KiB", hits, blocks, size>>10, elapsed, pulled/1024, bound/1024)
	must.Eq(t, float64(hits*size), pulled)
	must.LessEq(t, bound, pulled)
	must.Greater(t, 0, hits)
	must.Less(t, blocks, hits)
	must.GreaterEq(t, float64(blocks-hits), a.metric(t, `oasis_kvcached_peer_wan_fetches_total{dc="dc2",result="budget"}`))
}

// frozenDC2 SIGSTOPs dc2's Consul: a marks dc2 stale within its discovery
// timeout, while a block held by its local
// peer n is fetched at local speed and n leaving dc1's catalog still
// reaches a.
func frozenDC2(t *testing.T, dc1, dc2 *testutil.ConsulAgent, a, n *proc, nID string, discoveryTimeout time.Duration) {
	ctx := context.Background()
	must.Eq(t, 0.0, a.metric(t, `oasis_kvcached_peer_discovery_stale{dc="dc2"}`))
	must.NoError(t, syscall.Kill(dc2.Pid(), syscall.SIGSTOP))
	thawed := false
	thaw := func() {
		if !thawed {
			thawed = true
			must.NoError(t, syscall.Kill(dc2.Pid(), syscall.SIGCONT))
		}
	}
	t.Cleanup(thaw)
	frozenAt := time.Now()

	// Local lookups: a block only n holds, written after the freeze.
	local := []byte("held by n in dc1")
	must.NoError(t, n.client.Set(ctx, blockKey(200), local, 0).Err())
	n.waitMore(t, filtersServed, 2, 10*time.Second)
	start := time.Now()
	got, err := a.client.Get(ctx, blockKey(200)).Bytes()
	took := time.Since(start)
	must.NoError(t, err)
	must.Eq(t, local, got)
	must.Less(t, 500*time.Millisecond, took, must.Sprint("a local peer fetch slowed by the frozen datacenter"))

	// dc2 marked stale by the timeout of the query in flight at the freeze.
	waitFor(t, 3*discoveryTimeout, "dc2 marked stale", func() bool {
		return a.metric(t, `oasis_kvcached_peer_discovery_stale{dc="dc2"}`) == 1
	})
	staleAfter := time.Since(frozenAt)
	must.Less(t, discoveryTimeout+time.Second, staleAfter)

	// Local discovery: n leaving dc1's catalog reaches a while dc2 hangs.
	// b stays a peer: its QUIC filter exchange still answers.
	must.NoError(t, dc1.Client.Agent().ServiceDeregister(nID))
	left := time.Now()
	waitFor(t, 10*time.Second, "a to drop n", func() bool { return a.metric(t, "oasis_kvcached_peers_healthy") == 1 })
	t.Logf("frozen dc2: local peer fetch %s, stale after %s, local deregistration seen after %s",
		took.Round(time.Millisecond), staleAfter.Round(time.Millisecond), time.Since(left).Round(time.Millisecond))
	must.StrContains(t, a.Output(), "is not answering")

	thaw()
	waitFor(t, 30*time.Second, "dc2 fresh again", func() bool {
		return a.metric(t, `oasis_kvcached_peer_discovery_stale{dc="dc2"}`) == 0
	})
	must.Eq(t, 1.0, a.metric(t, `oasis_kvcached_peer_discovery_stale_total{dc="dc2"}`))
}

func TestPeerDatacenterFlags(t *testing.T) {
	var out bytes.Buffer
	c, _, err := parseFlags(nil, &out)
	must.NoError(t, err)
	must.SliceEmpty(t, c.PeerDatacenters, must.Sprint("remote datacenters must be off by default"))
	must.Eq(t, int64(100<<20), c.PeerWANBytesPerSecond)
	must.Eq(t, 5*time.Second, c.PeerWANTimeout)

	t.Setenv("CONSUL_HTTP_ADDR", "")
	_, _, err = parseFlags([]string{"--peer-datacenters", "dc2"}, &out)
	must.ErrorContains(t, err, "--peer-datacenters needs --quic-addr")
	c, _, err = parseFlags([]string{"--peer-datacenters", "dc2, dc3", "--quic-addr", "127.0.0.1:0", "--consul-addr", "127.0.0.1:1",
		"--peer-wan-bytes-per-second", "1GiB", "--peer-wan-timeout", "3s"}, &out)
	must.NoError(t, err)
	must.Eq(t, []string{"dc2", "dc3"}, c.PeerDatacenters)
	must.Eq(t, int64(1<<30), c.PeerWANBytesPerSecond)
	must.Eq(t, 3*time.Second, c.PeerWANTimeout)
}

// TestRemoteDatacenterNeedsAGlobalToken runs the two datacenters with ACLs
// (default deny, replicated from dc1) and the job's Consul policy: with a
// dc1-local token, dc1's kvcached warns that its token is not valid in dc2
// and finds no peer there (Consul runs the forwarded query as the anonymous
// token, which answers an empty list); with a global token holding the same
// policy it finds dc2's kvcached and fetches from it.
func TestRemoteDatacenterNeedsAGlobalToken(t *testing.T) {
	dc1, dc2 := testutil.StartConsulWANACL(t)
	rules, err := os.ReadFile(filepath.Join("..", "..", "jobs", "acl", "consul-oasis-kvcached.hcl"))
	must.NoError(t, err)
	_, _, err = dc1.Client.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: "oasis-kvcached", Rules: string(rules)}, nil)
	must.NoError(t, err)
	token := func(local bool) string {
		tok, _, err := dc1.Client.ACL().TokenCreate(&consulapi.ACLToken{Local: local,
			Policies: []*consulapi.ACLTokenPolicyLink{{Name: "oasis-kvcached"}}}, nil)
		must.NoError(t, err)
		return tok.SecretID
	}
	localToken, globalToken := token(true), token(false)
	waitFor(t, 30*time.Second, "dc2 to know the global token", func() bool {
		_, _, err := dc2.Client.ACL().TokenReadSelf(&consulapi.QueryOptions{Token: globalToken})
		return err == nil
	})

	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "oasis test CA")
	caFile, cert, key := ca.WriteFiles(t, dir, "node", peer.DefaultServerName)
	node := func(consul *testutil.ConsulAgent, token string, extra ...string) *proc {
		q := testutil.FreeAddr(t)
		args := append([]string{"--quic-addr", q, "--quic-advertise", q, "--tls-ca", caFile, "--tls-cert", cert, "--tls-key", key,
			"--peer-filter-interval", "200ms", "--consul-addr", consul.HTTPAddr}, extra...)
		p := startEnv(t, []string{"CONSUL_HTTP_TOKEN=" + token}, args...)
		rp, _ := strconv.Atoi(port(t, p.addr))
		qp, _ := strconv.Atoi(port(t, q))
		reg := &consulapi.AgentServiceRegistration{
			ID: "kvcached-" + q, Name: "oasis-kvcached", Address: "127.0.0.1", Port: rp,
			Meta: map[string]string{peer.QUICPortMeta: strconv.Itoa(qp)},
		}
		// dc2's servers resolve the management token by replication from dc1, which can lag
		// the replication status the helper waited for: a registration there may be refused
		// (403) until they have it.
		var err error
		waitFor(t, 30*time.Second, "the agent to accept the registration", func() bool {
			err = consul.Client.Agent().ServiceRegister(reg)
			return err == nil
		})
		must.NoError(t, err)
		return p
	}
	b := node(dc2, globalToken)
	must.NoError(t, b.client.Set(context.Background(), blockKey(9), []byte("nine"), 0).Err())
	withLocal := node(dc1, localToken, "--peer-datacenters", "dc2")
	withGlobal := node(dc1, globalToken, "--peer-datacenters", "dc2")

	waitFor(t, 30*time.Second, "the global token's node to fetch from dc2", func() bool {
		return withGlobal.client.Get(context.Background(), blockKey(9)).Val() == "nine"
	})
	must.StrContains(t, withLocal.Output(), "not valid in the remote datacenter")
	must.StrNotContains(t, withGlobal.Output(), "not valid in the remote datacenter")
	// The local token's node sees its dc1 neighbour but nobody in dc2.
	waitFor(t, 10*time.Second, "the local token's node to see its dc1 neighbour", func() bool {
		return withLocal.metric(t, "oasis_kvcached_peers_healthy") == 1
	})
	// Several queries to dc2 answered meanwhile.
	withLocal.waitMore(t, `oasis_kvcached_peer_discovery_queries_total{dc="dc2",result="ok"}`, 3, 30*time.Second)
	must.StrNotContains(t, withLocal.Output(), `kvcached peer set changed: dc=dc2`)
	must.Eq(t, 1.0, withLocal.metric(t, "oasis_kvcached_peers_healthy"))
	must.Eq(t, 0.0, withLocal.metric(t, `oasis_kvcached_peer_wan_fetches_total{dc="dc2",result="hit"}`))
}
