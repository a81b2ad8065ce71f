package peer

import (
	"github.com/oasis-llm/oasis/internal/bloom"
	"github.com/oasis-llm/oasis/internal/testutil"

	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

type mapStore struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (s *mapStore) GetLocal(k string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[k]
	return v, ok
}

func (s *mapStore) Keys() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.m))
	for k := range s.m {
		out = append(out, k)
	}
	return out
}

func node(t testing.TB, ca *tlsfilestest.CA, local Local) *Node {
	t.Helper()
	return budgetedNode(t, ca, local, nil)
}

func budgetedNode(t testing.TB, ca *tlsfilestest.CA, local Local, budget Budget) *Node {
	t.Helper()
	cert := ca.Issue(t, DefaultServerName, DefaultServerName).TLS(t)
	st, ct, err := TLSConfigs(tlsfilestest.Pool(ca), cert, "")
	must.NoError(t, err)
	n, err := New(Config{ListenAddr: "127.0.0.1:0", ServerTLS: st, ClientTLS: ct, Local: local,
		FetchTimeout: 500 * time.Millisecond, FilterInterval: 100 * time.Millisecond, Budget: budget})
	must.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	go n.Run(context.Background()) // ends at Close
	return n
}

func TestFetchBetweenPeers(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	a := node(t, ca, &mapStore{m: map[string][]byte{"blk": big, "small": []byte("x")}})
	b := node(t, ca, &mapStore{m: map[string][]byte{}})
	b.SetPeers([]string{a.Addr().String()})
	b.RefreshFilters(context.Background())
	must.True(t, b.MayHave("blk"))
	must.False(t, b.MayHave("absent-key-1"))

	ctx := context.Background()
	v, err := b.Fetch(ctx, "blk")
	must.NoError(t, err)
	must.True(t, bytes.Equal(big, v))
	// Concurrent fetches share the one connection.
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := b.Fetch(ctx, "small")
			must.NoError(t, err)
			must.Eq(t, "x", string(v))
		}()
	}
	wg.Wait()
	_, err = b.Fetch(ctx, "absent-key-1")
	must.ErrorIs(t, err, ErrNotFound)
}

// peakBudget records what is held and the most ever held at once.
type peakBudget struct {
	mu              sync.Mutex
	held, peak, all int64
}

func (b *peakBudget) Acquire(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held += n
	b.all += n
	b.peak = max(b.peak, b.held)
}

func (b *peakBudget) Release(n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held -= n
}

// costStore is a mapStore whose blocks all cost their size to read, like
// blocks on the disk tier.
type costStore struct{ mapStore }

func (s *costStore) ReadCost(k string) int64 {
	v, _ := s.GetLocal(k)
	return int64(len(v))
}

// TestFetchAndServeBuffersAreBudgeted checks both ends take a block's bytes
// from their memory budget while they hold its buffer, and give them back.
func TestFetchAndServeBuffersAreBudgeted(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	big := bytes.Repeat([]byte("b"), 1<<20)
	var ab, bb peakBudget
	a := budgetedNode(t, ca, &costStore{mapStore{m: map[string][]byte{"blk": big}}}, &ab)
	b := budgetedNode(t, ca, &mapStore{m: map[string][]byte{}}, &bb)
	b.SetPeers([]string{a.Addr().String()})
	b.RefreshFilters(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 4; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := b.Fetch(context.Background(), "blk")
			must.NoError(t, err)
			must.Eq(t, len(big), len(v))
		}()
	}
	wg.Wait()
	must.Eq(t, int64(4<<20), bb.all)
	must.Eq(t, int64(0), bb.held)
	must.Between(t, int64(1<<20), bb.peak, int64(4<<20))
	// The serving side releases after the reply is written, which may be
	// just after the client has read it.
	testutil.Eventually(t, 5*time.Second, "the serving side to release its buffer budget", func() bool {
		ab.mu.Lock()
		defer ab.mu.Unlock()
		return ab.held == 0
	})
	must.Eq(t, int64(4<<20), ab.all)
}

func TestPeerWithForeignCertificateIsRefused(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	rogue := tlsfilestest.NewCA(t, "rogue CA")
	a := node(t, ca, &mapStore{m: map[string][]byte{"blk": []byte("secret")}})
	// b trusts the real CA but presents a certificate from another CA.
	cert := rogue.Issue(t, DefaultServerName, DefaultServerName).TLS(t)
	st, ct, err := TLSConfigs(tlsfilestest.Pool(ca), cert, "")
	must.NoError(t, err)
	b, err := New(Config{ListenAddr: "127.0.0.1:0", ServerTLS: st, ClientTLS: ct, Local: &mapStore{m: map[string][]byte{}},
		FetchTimeout: 500 * time.Millisecond, FilterInterval: time.Hour})
	must.NoError(t, err)
	defer b.Close()
	go b.Run(context.Background())
	b.SetPeers([]string{a.Addr().String()})
	p := b.peers[peerKey{addr: a.Addr().String()}]
	_, err = b.request(context.Background(), p, opGet, "blk", 1<<20)
	must.Error(t, err)
	b.RefreshFilters(context.Background())
	must.False(t, b.MayHave("blk"))
	must.Eq(t, 0.0, gauge(b))
}

func TestDeadPeerCostsOneTimeoutThenIsSkipped(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	a := node(t, ca, &mapStore{m: map[string][]byte{"blk": []byte("v")}})
	b := node(t, ca, &mapStore{m: map[string][]byte{}})
	// A UDP socket that never answers stands in for a dead peer.
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	must.NoError(t, err)
	defer dead.Close()
	b.SetPeers([]string{a.Addr().String(), dead.LocalAddr().String()})
	b.RefreshFilters(context.Background())
	must.Eq(t, 1.0, gauge(b))
	// Pretend the dead peer was healthy with a filter claiming everything.
	dp := b.peers[peerKey{addr: dead.LocalAddr().String()}]
	dp.mu.Lock()
	dp.healthy = true
	dp.filter, err = bloom.Unmarshal([]byte{1, 8, 0, 0, 0, 0xff}) // one hash, every bit set
	must.NoError(t, err)
	dp.mu.Unlock()

	start := time.Now()
	_, err = b.Fetch(context.Background(), "only-dead-claims-this")
	must.ErrorIs(t, err, ErrNotFound)
	first := time.Since(start)
	must.Greater(t, 400*time.Millisecond, first)
	// Now skipped: no timeout paid again.
	start = time.Now()
	_, err = b.Fetch(context.Background(), "only-dead-claims-this")
	must.ErrorIs(t, err, ErrNotFound)
	must.Less(t, 100*time.Millisecond, time.Since(start))
	v, err := b.Fetch(context.Background(), "blk")
	must.NoError(t, err)
	must.Eq(t, "v", string(v))
}

func TestPeerComesBackWhenHealthy(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	store := &mapStore{m: map[string][]byte{"k": []byte("v")}}
	a := node(t, ca, store)
	addr := a.Addr().String()
	b := node(t, ca, &mapStore{m: map[string][]byte{}})
	b.SetPeers([]string{addr})
	b.RefreshFilters(context.Background())
	must.Eq(t, 1.0, gauge(b))
	a.Close()
	b.RefreshFilters(context.Background())
	must.Eq(t, 0.0, gauge(b))
	// Restart on the same port.
	cert := ca.Issue(t, DefaultServerName, DefaultServerName).TLS(t)
	st, ct, _ := TLSConfigs(tlsfilestest.Pool(ca), cert, "")
	a2, err := New(Config{ListenAddr: addr, ServerTLS: st, ClientTLS: ct, Local: store, FetchTimeout: 500 * time.Millisecond})
	must.NoError(t, err)
	defer a2.Close()
	go a2.Run(context.Background())
	testutil.EventuallyEvery(t, 5*time.Second, 50*time.Millisecond, "b to learn from a2's filter that it may have k", func() bool { return b.MayHave("k") })
	v, err := b.Fetch(context.Background(), "k")
	must.NoError(t, err)
	must.Eq(t, "v", string(v))
}

func gauge(n *Node) float64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	h := 0
	for _, p := range n.peers {
		// p.healthy is written under p.mu (RefreshFilters, markDown).
		p.mu.Lock()
		if p.healthy {
			h++
		}
		p.mu.Unlock()
	}
	return float64(h)
}

func TestSelfMatcher(t *testing.T) {
	listen := &net.UDPAddr{IP: net.IPv4zero, Port: 7379}
	m := SelfMatcher("", listen)
	must.True(t, m("127.0.0.1:7379"))
	must.False(t, m("127.0.0.1:7380"))
	must.False(t, m("192.0.2.1:7379"))
	m = SelfMatcher("10.1.2.3:7379", listen)
	must.True(t, m("10.1.2.3:7379"))
	must.False(t, m("127.0.0.1:7379"))
	m = SelfMatcher("", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9})
	must.True(t, m("127.0.0.1:9"))
}

// With per-node certificates (ClientTLS without a ServerName, what
// --tls-verify-address sets), a peer must present a certificate naming the
// address it is dialled at: a node with a valid certificate for another
// node's address, or with the shared name only, is refused.
// The same holds through LoadTLS (meshid's files identity, what
// oasis-kvcached runs), whose verification is meshid's own.
func TestPeerCertificateMustNameTheNode(t *testing.T) {
	t.Run("TLSConfigs", func(t *testing.T) {
		testPeerCertificateMustNameTheNode(t, func(ca *tlsfilestest.CA, names []string) (*tls.Config, *tls.Config) {
			cert := ca.Issue(t, names[0], names...).TLS(t)
			st, ct, err := TLSConfigs(tlsfilestest.Pool(ca), cert, "")
			must.NoError(t, err)
			ct.ServerName = ""
			return st, ct
		})
	})
	t.Run("LoadTLS", func(t *testing.T) {
		dir := t.TempDir()
		testPeerCertificateMustNameTheNode(t, func(ca *tlsfilestest.CA, names []string) (*tls.Config, *tls.Config) {
			caFile, cert, key := ca.WriteFiles(t, dir, names[0]+"-"+strconv.Itoa(len(names)), names...)
			st, ct, err := LoadTLS(TLSFiles{CA: caFile, Cert: cert, Key: key, VerifyAddress: true})
			must.NoError(t, err)
			must.EqOp(t, "", ct.ServerName)
			return st, ct
		})
	})
}

func testPeerCertificateMustNameTheNode(t *testing.T, configs func(ca *tlsfilestest.CA, names []string) (*tls.Config, *tls.Config)) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	addrNode := func(listen string, names ...string) *Node {
		t.Helper()
		st, ct := configs(ca, names)
		n, err := New(Config{ListenAddr: listen + ":0", ServerTLS: st, ClientTLS: ct,
			Local:        &mapStore{m: map[string][]byte{"blk": []byte("from " + listen)}},
			FetchTimeout: 2 * time.Second, FilterInterval: time.Hour})
		must.NoError(t, err)
		t.Cleanup(func() { n.Close() })
		go n.Run(context.Background())
		return n
	}
	a := addrNode("127.0.0.2", "127.0.0.2")
	b := addrNode("127.0.0.3", "127.0.0.3")
	impostor := addrNode("127.0.0.4", "127.0.0.2")     // a's name, another address
	shared := addrNode("127.0.0.5", DefaultServerName) // the one shared name
	b.SetPeers([]string{a.Addr().String(), impostor.Addr().String(), shared.Addr().String()})
	ctx := context.Background()

	v, err := b.request(ctx, b.peers[peerKey{addr: a.Addr().String()}], opGet, "blk", 1<<20)
	must.NoError(t, err)
	must.Eq(t, "from 127.0.0.2", string(v))
	for _, n := range []*Node{impostor, shared} {
		_, err := b.request(ctx, b.peers[peerKey{addr: n.Addr().String()}], opGet, "blk", 1<<20)
		must.ErrorContains(t, err, "x509: ")
	}
}

// Config.Authorize is asked on every stream of an established connection:
// a caller refused after it connected loses the connection at its next
// request, and is let in again by a new handshake once allowed.
func TestAuthorizeRecheckedOnEveryStream(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	var denied atomic.Bool
	cert := ca.Issue(t, DefaultServerName, DefaultServerName).TLS(t)
	st, ct, err := TLSConfigs(tlsfilestest.Pool(ca), cert, "")
	must.NoError(t, err)
	st.VerifyConnection = func(cs tls.ConnectionState) error {
		if denied.Load() {
			return errors.New("denied at the handshake")
		}
		return nil
	}
	reg := prometheus.NewRegistry()
	a, err := New(Config{ListenAddr: "127.0.0.1:0", ServerTLS: st, ClientTLS: ct, Registerer: reg,
		Local:          &mapStore{m: map[string][]byte{"k1": []byte("v1"), "k2": []byte("v2"), "k3": []byte("v3")}},
		FilterInterval: time.Hour,
		Authorize: func(tls.ConnectionState) error {
			if denied.Load() {
				return errors.New("denied")
			}
			return nil
		}})
	must.NoError(t, err)
	defer a.Close()
	go a.Run(context.Background())
	b := node(t, ca, &mapStore{m: map[string][]byte{}})
	b.SetPeers([]string{a.Addr().String()})
	b.RefreshFilters(context.Background())
	ctx := context.Background()
	v, err := b.Fetch(ctx, "k1")
	must.NoError(t, err)
	must.EqOp(t, "v1", string(v))

	denied.Store(true)
	_, err = b.Fetch(ctx, "k2") // on the connection made while allowed
	must.ErrorIs(t, err, ErrNotFound)
	must.EqOp(t, 1.0, promtestutil.ToFloat64(a.mDenied))
	b.RefreshFilters(ctx) // a new handshake: refused there
	must.False(t, b.MayHave("k2"))

	denied.Store(false)
	b.RefreshFilters(ctx)
	v, err = b.Fetch(ctx, "k3")
	must.NoError(t, err)
	must.EqOp(t, "v3", string(v))
}

// LoadTLS goes through meshid's files identity: TLS 1.3 and the ALPN hold
// on the configuration each handshake gets, not only on the one returned.
func TestLoadTLSKeepsTLS13AndALPN(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	caFile, cert, key := ca.WriteFiles(t, t.TempDir(), "n", DefaultServerName)
	st, ct, err := LoadTLS(TLSFiles{CA: caFile, Cert: cert, Key: key})
	must.NoError(t, err)
	hs, err := st.GetConfigForClient(&tls.ClientHelloInfo{})
	must.NoError(t, err)
	for _, c := range []*tls.Config{st, hs, ct} {
		must.EqOp(t, uint16(tls.VersionTLS13), c.MinVersion)
		must.Eq(t, []string{ALPN}, c.NextProtos)
	}
	must.EqOp(t, tls.RequireAndVerifyClientCert, hs.ClientAuth)
	must.NotNil(t, hs.ClientCAs)
	must.EqOp(t, DefaultServerName, ct.ServerName)
}
