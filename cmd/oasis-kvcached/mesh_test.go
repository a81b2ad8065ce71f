package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/kvcached/peer"
)

// untilFetch asks p for a block only the other node holds, a new one each
// time (a fetched block stays in p's store), until the answer is as wanted;
// it returns how long that took from start.
func untilFetch(t *testing.T, p *proc, next *int, want bool, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	ctx := context.Background()
	testutil.Eventually(t, within-time.Since(start), fmt.Sprintf("fetches to become %t", want), func() bool {
		i := *next
		*next++
		v, err := p.client.Get(ctx, blockKey(i)).Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatalf("GET %s: %v", blockKey(i), err)
		}
		return (err == nil && string(v) == string(blockValue(i))) == want
	})
	return time.Since(start)
}

// TestMeshPeersFollowIntentions runs two kvcached with --mesh against a real
// Consul (Connect on in dev mode): they fetch blocks from each other with
// their Connect leaves; a deny intention stops fetches on the connection
// already open, allowing again brings them back; a node with a certificate
// from another CA is refused.
func TestMeshPeersFollowIntentions(t *testing.T) {
	client, consulAddr := testutil.StartConsul(t)
	qa, qb := testutil.FreeAddr(t), testutil.FreeAddr(t)
	common := []string{"--mesh", "--consul-addr", consulAddr, "--peer-filter-interval", "200ms", "--peer-timeout", "1s"}
	a := start(t, append([]string{"--quic-addr", qa, "--quic-advertise", qa}, common...)...)
	b := start(t, append([]string{"--quic-addr", qb, "--quic-advertise", qb}, common...)...)
	for id, p := range map[string]*proc{"kvcached-a": a, "kvcached-b": b} {
		rp, _ := strconv.Atoi(port(t, p.addr))
		must.NoError(t, client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: id, Name: "oasis-kvcached", Address: "127.0.0.1", Port: rp,
			Meta: map[string]string{peer.QUICPortMeta: port(t, p.quicAddr)},
		}))
	}
	ctx := context.Background()
	const blocks = 400
	for i := range blocks {
		must.NoError(t, a.client.Set(ctx, blockKey(i), blockValue(i), 0).Err())
	}
	must.NoError(t, b.client.Set(ctx, blockKey(blocks), blockValue(blocks), 0).Err())
	testutil.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "each to count the other as a healthy peer", func() bool {
		return a.metric(t, "oasis_kvcached_peers_healthy") == 1 && b.metric(t, "oasis_kvcached_peers_healthy") == 1
	})
	// Each fetches from the other once its filter, exchanged every 200ms,
	// lists the block.
	// Deadlines are generous (the machine may be loaded): the delays are logged, not asserted;
	// their figures belong in a benchmark, not a timed test.
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "a to fetch b's block once b's filter lists it", func() bool {
		return a.client.Get(ctx, blockKey(blocks)).Val() == string(blockValue(blocks))
	})
	next := 0
	untilFetch(t, b, &next, true, time.Now(), 15*time.Second)
	must.Positive(t, a.metric(t, `oasis_mesh_authorizations_total{cached="false",result="allowed"}`))
	must.StrContains(t, a.Output(), "peer identity from Consul Connect")

	// The deny reaches b's connection, open and kept alive since before it.
	t0 := time.Now()
	testutil.SetIntentions(t, client, "oasis-kvcached") // peers denied
	delay := untilFetch(t, b, &next, false, t0, 20*time.Second)
	t.Logf("deny intention written (call started) to first refused fetch: %s", delay)
	testutil.EventuallyEvery(t, 15*time.Second, 50*time.Millisecond, "b to drop a as a healthy peer after the deny intention", func() bool {
		return b.metric(t, "oasis_kvcached_peers_healthy") == 0
	})
	t.Logf("connections a closed as no longer authorized: %v", a.metric(t, "oasis_kvcached_peer_connections_denied_total"))

	t0 = time.Now()
	testutil.SetIntentions(t, client, "oasis-kvcached", "oasis-kvcached")
	delay = untilFetch(t, b, &next, true, t0, 20*time.Second)
	t.Logf("allow intention written (call started) to first fetch served: %s", delay)

	// A node whose certificate comes from another CA cannot fetch.
	ca := tlsfilestest.NewCA(t, "not the mesh CA")
	caFile, cert, key := ca.WriteFiles(t, t.TempDir(), "c", peer.DefaultServerName)
	c := start(t, "--quic-addr", testutil.FreeAddr(t), "--peers", qa, "--peer-filter-interval", "200ms", "--peer-timeout", "1s",
		"--tls-ca", caFile, "--tls-cert", cert, "--tls-key", key)
	c.waitMore(t, `oasis_kvcached_peer_filter_exchanges_total{result="error"}`, 3, 10*time.Second) // several failed exchanges
	must.EqOp(t, 0.0, c.metric(t, "oasis_kvcached_peers_healthy"))
	_, err := c.client.Get(ctx, blockKey(next)).Bytes()
	must.ErrorIs(t, err, redis.Nil)
}

// TestMeshWithTheJobsConsulPolicy runs --mesh with ACLs on (default deny)
// and a token holding only the job's policy
// (jobs/acl/consul-oasis-kvcached.hcl): it suffices for the leaf, the
// authorizations and discovery; the intention to allow kvcached to kvcached
// is needed (the default policy denies); with service:read only, Consul
// refuses the leaf.
func TestMeshWithTheJobsConsulPolicy(t *testing.T) {
	dc1, _ := testutil.StartConsulWANACL(t)
	rules, err := os.ReadFile(filepath.Join("..", "..", "jobs", "acl", "consul-oasis-kvcached.hcl"))
	must.NoError(t, err)
	token := func(name, rules string) string {
		_, _, err := dc1.Client.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: name, Rules: rules}, nil)
		must.NoError(t, err)
		tok, _, err := dc1.Client.ACL().TokenCreate(&consulapi.ACLToken{
			Policies: []*consulapi.ACLTokenPolicyLink{{Name: name}}}, nil)
		must.NoError(t, err)
		return tok.SecretID
	}
	jobToken := token("oasis-kvcached", string(rules))
	readToken := token("read-only", `service "oasis-kvcached" { policy = "read" }`)
	_, _, err = dc1.Client.Agent().ConnectCALeaf("oasis-kvcached", &consulapi.QueryOptions{Token: readToken})
	must.ErrorContains(t, err, "Permission denied")
	testutil.SetIntentions(t, dc1.Client, "oasis-kvcached", "oasis-kvcached")

	node := func() *proc {
		q := testutil.FreeAddr(t)
		p := startEnv(t, []string{"CONSUL_HTTP_TOKEN=" + jobToken}, "--mesh", "--quic-addr", q, "--quic-advertise", q,
			"--peer-filter-interval", "200ms", "--consul-addr", dc1.HTTPAddr)
		rp, _ := strconv.Atoi(port(t, p.addr))
		must.NoError(t, dc1.Client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: "kvcached-" + q, Name: "oasis-kvcached", Address: "127.0.0.1", Port: rp,
			Meta: map[string]string{peer.QUICPortMeta: port(t, q)},
		}))
		return p
	}
	a, b := node(), node()
	must.NoError(t, a.client.Set(context.Background(), blockKey(3), blockValue(3), 0).Err())
	waitFor(t, 15*time.Second, "b to fetch a's block in the mesh", func() bool {
		return b.client.Get(context.Background(), blockKey(3)).Val() == string(blockValue(3))
	})
	// The intention watch (intentions:read, implied by service:write) works.
	must.StrNotContains(t, a.Output(), "following Consul failed")
}

func TestMeshFlagNeedsConsul(t *testing.T) {
	_, _, err := parseFlags([]string{"--mesh", "--quic-addr", "127.0.0.1:0"}, testWriter{t})
	must.ErrorContains(t, err, "--mesh needs")
	_, _, err = parseFlags([]string{"--mesh", "--quic-addr", "127.0.0.1:0", "--consul-addr", "127.0.0.1:1", "--tls-ca", "ca.pem"}, testWriter{t})
	must.ErrorContains(t, err, "drop --tls-ca")
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) { w.t.Log(string(b)); return len(b), nil }
