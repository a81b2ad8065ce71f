package main

import (
	"context"
	"net"
	"strconv"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/kvcached/peer"
)

func port(t *testing.T, addr string) string {
	_, p, err := net.SplitHostPort(addr)
	must.NoError(t, err)
	return p
}

// TestPeersFromConsulCatalog registers two kvcached instances in a real
// Consul (as Nomad's service block does: service oasis-kvcached, meta
// oasis_quic_port) and checks they find and fetch from each other, and that
// a deregistered instance leaves the peer set.
func TestPeersFromConsulCatalog(t *testing.T) {
	client, consulAddr := testutil.StartConsul(t)
	dir := t.TempDir()
	ca := tlsfilestest.NewCA(t, "oasis test CA")
	caFile, certA, keyA := ca.WriteFiles(t, dir, "a", peer.DefaultServerName)
	_, certB, keyB := ca.WriteFiles(t, dir, "b", peer.DefaultServerName)
	qa, qb := testutil.FreeAddr(t), testutil.FreeAddr(t)

	common := []string{"--tls-ca", caFile, "--peer-filter-interval", "200ms", "--peer-timeout", "1s",
		"--consul-addr", consulAddr}
	a := start(t, append([]string{"--quic-addr", qa, "--quic-advertise", qa, "--tls-cert", certA, "--tls-key", keyA}, common...)...)
	// b listens on the wildcard address without --quic-advertise, as the
	// Nomad job runs it: it must still recognise itself in the catalog.
	b := start(t, append([]string{"--quic-addr", "0.0.0.0:" + port(t, qb), "--tls-cert", certB, "--tls-key", keyB}, common...)...)

	register := func(id, redisAddr, quicAddr string) {
		rp, _ := strconv.Atoi(port(t, redisAddr))
		must.NoError(t, client.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
			ID: id, Name: "oasis-kvcached", Address: "127.0.0.1", Port: rp,
			Meta: map[string]string{peer.QUICPortMeta: port(t, quicAddr)},
		}))
	}
	register("kvcached-a", a.addr, qa)
	register("kvcached-b", b.addr, qb)

	ctx := context.Background()
	must.NoError(t, a.client.Set(ctx, blockKey(7), []byte("block seven"), 0).Err())
	testutil.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "b to fetch block 7 from a", func() bool {
		return b.client.Get(ctx, blockKey(7)).Val() == "block seven"
	})
	testutil.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "each to count the other as a healthy peer", func() bool {
		return a.metric(t, "oasis_kvcached_peers_healthy") == 1 && b.metric(t, "oasis_kvcached_peers_healthy") == 1
	})
	// Each has exactly the other as a peer, not itself.
	must.StrContains(t, b.Output(), `kvcached peer set changed: peers=["`+qa+`"]`)
	must.StrContains(t, a.Output(), `kvcached peer set changed: peers=["`+qb+`"]`)

	// a leaves the catalog: b drops it from its peer set.
	must.NoError(t, client.Agent().ServiceDeregister("kvcached-a"))
	testutil.EventuallyEvery(t, 15*time.Second, 100*time.Millisecond, "b to drop a from its peers", func() bool {
		return b.metric(t, "oasis_kvcached_peers_healthy") == 0
	})
}
