package peer

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/bloom"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

// fakeClock is a settable clock for the WAN budget.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func TestTokenBucket(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := newTokenBucket(1000, clock.Now)
	must.True(t, b.take(600))
	must.False(t, b.take(600), must.Sprint("600 admitted with 400 left"))
	must.True(t, b.has(400))
	must.False(t, b.has(401))
	clock.Advance(300 * time.Millisecond) // +300
	must.True(t, b.take(700))
	must.False(t, b.has(1))
	clock.Advance(10 * time.Second) // the burst is one second's worth
	must.False(t, b.take(1001))
	must.True(t, b.take(1000))
	// A refused take takes nothing.
	clock.Advance(500 * time.Millisecond)
	must.False(t, b.take(501))
	must.True(t, b.take(500))

	var unlimited *tokenBucket
	must.Nil(t, newTokenBucket(0, nil))
	must.True(t, unlimited.take(1<<40))
	must.True(t, unlimited.has(1<<40))
}

// wanNode is a node fetching from remote datacenters dcs.
func wanNode(t testing.TB, ca *tlsfilestest.CA, local Local, reg prometheus.Registerer, cfg Config) *Node {
	t.Helper()
	cert := ca.Issue(t, DefaultServerName, DefaultServerName).TLS(t)
	st, ct, err := TLSConfigs(tlsfilestest.Pool(ca), cert, "")
	must.NoError(t, err)
	cfg.ListenAddr, cfg.ServerTLS, cfg.ClientTLS, cfg.Local, cfg.Registerer = "127.0.0.1:0", st, ct, local, reg
	cfg.FetchTimeout, cfg.FilterInterval = 500*time.Millisecond, time.Hour
	n, err := New(cfg)
	must.NoError(t, err)
	t.Cleanup(func() { n.Close() })
	go n.Run(context.Background()) // ends at Close
	return n
}

func served(n *Node) float64 { return promtest.ToFloat64(n.mServed.WithLabelValues("get", "hit")) }

func wanCount(n *Node, dc, result string) float64 {
	return promtest.ToFloat64(n.wan.fetches.WithLabelValues(dc, result))
}

func TestLocalPeersAreAskedBeforeRemoteOnes(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	local := node(t, ca, &mapStore{m: map[string][]byte{"both": []byte("local copy")}})
	dc2 := node(t, ca, &mapStore{m: map[string][]byte{"both": []byte("dc2 copy"), "dc2-only": []byte("from dc2")}})
	dc3 := node(t, ca, &mapStore{m: map[string][]byte{"dc2-only": []byte("from dc3")}})
	b := wanNode(t, ca, &mapStore{m: map[string][]byte{}}, prometheus.NewRegistry(), Config{Datacenters: []string{"dc2", "dc3"}})
	b.SetPeers([]string{local.Addr().String()})
	must.NoError(t, b.SetRemotePeers("dc3", []string{dc3.Addr().String()}))
	must.NoError(t, b.SetRemotePeers("dc2", []string{dc2.Addr().String()}))
	b.RefreshFilters(context.Background())

	for range 5 { // map order varies: the order must not
		v, err := b.Fetch(context.Background(), "both")
		must.NoError(t, err)
		must.Eq(t, "local copy", string(v))
	}
	must.Eq(t, 0.0, served(dc2), must.Sprint("a remote datacenter was asked for a block a local peer holds"))
	// Held only remotely: the first datacenter listed answers.
	v, err := b.Fetch(context.Background(), "dc2-only")
	must.NoError(t, err)
	must.Eq(t, "from dc2", string(v))
	must.Eq(t, 0.0, served(dc3))
	must.Eq(t, 1.0, wanCount(b, "dc2", "hit"))
	must.Eq(t, float64(len("from dc2")), promtest.ToFloat64(b.wan.bytes.WithLabelValues("dc2", "block")))
	must.Greater(t, 0.0, promtest.ToFloat64(b.wan.bytes.WithLabelValues("dc2", "filter")))
	must.Eq(t, []string{local.Addr().String()}, b.Peers())
	must.Eq(t, []string{dc2.Addr().String()}, b.RemotePeers("dc2"))

	// Replacing one datacenter's set leaves the others alone.
	must.NoError(t, b.SetRemotePeers("dc2", nil))
	must.Eq(t, []string{local.Addr().String()}, b.Peers())
	must.Eq(t, []string{dc3.Addr().String()}, b.RemotePeers("dc3"))
	var ce *ConfigError
	must.True(t, errors.As(b.SetRemotePeers("dc9", nil), &ce))
}

func TestWANBudgetSkipsFetchesOverIt(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	kib := bytes.Repeat([]byte("k"), 1024)
	remote := node(t, ca, &mapStore{m: map[string][]byte{"small": []byte("0123456789"), "a": kib, "b": kib, "c": kib}})
	clock := &fakeClock{t: time.Unix(1000, 0)}
	b := wanNode(t, ca, &mapStore{m: map[string][]byte{}}, prometheus.NewRegistry(),
		Config{Datacenters: []string{"dc2"}, WANBytesPerSecond: 1500, Now: clock.Now})
	must.NoError(t, b.SetRemotePeers("dc2", []string{remote.Addr().String()}))
	b.RefreshFilters(context.Background())

	_, err := b.Fetch(context.Background(), "small") // 1490 left; estimate 10 bytes
	must.NoError(t, err)
	_, err = b.Fetch(context.Background(), "a") // 466 left; estimate 1 KiB
	must.NoError(t, err)
	// Over the budget by the estimate: skipped without asking the peer.
	before := served(remote)
	_, err = b.Fetch(context.Background(), "b")
	must.ErrorIs(t, err, ErrNotFound)
	must.Eq(t, before, served(remote), must.Sprint("a fetch over the budget was sent"))
	must.Eq(t, 1.0, wanCount(b, "dc2", "budget"))

	// Refilled: allowed again, and the bytes stay within rate × time + burst.
	clock.Advance(time.Second)
	_, err = b.Fetch(context.Background(), "b")
	must.NoError(t, err)
	must.Eq(t, 10.0+2048, promtest.ToFloat64(b.wan.bytes.WithLabelValues("dc2", "block")))

	// The estimate lets a fetch go that its reply's header shows is too
	// large: refused then, not counted as a peer failure.
	b.dcs["dc2"].lastSize.Store(1)
	_, err = b.Fetch(context.Background(), "c")
	must.ErrorIs(t, err, ErrNotFound)
	must.Eq(t, 2.0, wanCount(b, "dc2", "budget"))
	must.Eq(t, 1.0, gauge(b), must.Sprint("a budget refusal marked the peer down"))
	must.Eq(t, int64(1024), b.dcs["dc2"].lastSize.Load())
}

func TestRemoteFetchTimesOutByItsOwnTimeout(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	b := wanNode(t, ca, &mapStore{m: map[string][]byte{}}, prometheus.NewRegistry(),
		Config{Datacenters: []string{"dc2"}, WANFetchTimeout: 300 * time.Millisecond})
	dead, err := net.ListenPacket("udp", "127.0.0.1:0")
	must.NoError(t, err)
	defer dead.Close()
	must.NoError(t, b.SetRemotePeers("dc2", []string{dead.LocalAddr().String()}))
	dp := b.peers[peerKey{"dc2", dead.LocalAddr().String()}]
	dp.mu.Lock()
	dp.healthy = true
	dp.filter, err = bloom.Unmarshal([]byte{1, 8, 0, 0, 0, 0xff}) // one hash, every bit set
	must.NoError(t, err)
	dp.mu.Unlock()
	start := time.Now()
	_, err = b.Fetch(context.Background(), "k")
	must.ErrorIs(t, err, ErrNotFound)
	took := time.Since(start)
	must.Between(t, 250*time.Millisecond, took, 450*time.Millisecond) // the WAN timeout, not FetchTimeout's 500 ms
	must.Eq(t, 1.0, wanCount(b, "dc2", "timeout"))
}

func TestDatacenterStaleness(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	b := wanNode(t, ca, &mapStore{m: map[string][]byte{}}, prometheus.NewRegistry(), Config{Datacenters: []string{"dc2"}})
	stale := func() float64 { return promtest.ToFloat64(b.wan.stale.WithLabelValues("dc2")) }
	times := func() float64 { return promtest.ToFloat64(b.wan.staleTotal.WithLabelValues("dc2")) }
	b.SetDatacenterStale("dc2", true)
	b.SetDatacenterStale("dc2", true)
	must.Eq(t, 1.0, stale())
	must.Eq(t, 1.0, times(), must.Sprint("staying stale counted again"))
	must.True(t, b.DatacenterStale("dc2"))
	b.SetDatacenterStale("dc2", false)
	must.Eq(t, 0.0, stale())
	b.SetDatacenterStale("dc2", true)
	must.Eq(t, 2.0, times())
	b.SetDatacenterStale("dc9", true) // not configured: ignored
	must.False(t, b.DatacenterStale("dc9"))
}

func TestConfigRefusesBadDatacenters(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "kvcached test CA")
	cert := ca.Issue(t, DefaultServerName, DefaultServerName).TLS(t)
	st, ct, err := TLSConfigs(tlsfilestest.Pool(ca), cert, "")
	must.NoError(t, err)
	for _, dcs := range [][]string{{""}, {"dc2", "dc2"}, {"dc 2"}, {"dc2/../x"}} {
		_, err := New(Config{ListenAddr: "127.0.0.1:0", ServerTLS: st, ClientTLS: ct, Local: &mapStore{}, Datacenters: dcs})
		var ce *ConfigError
		must.True(t, errors.As(err, &ce), must.Sprintf("%q: %v", dcs, err))
	}
	_, err = New(Config{ListenAddr: "127.0.0.1:0", ServerTLS: st, ClientTLS: ct, Local: &mapStore{}, WANBytesPerSecond: -1})
	must.Error(t, err)
}

func TestRemoteRegistrationsAreValidated(t *testing.T) {
	entry := func(addr, port string) *consulapi.ServiceEntry {
		return &consulapi.ServiceEntry{Service: &consulapi.AgentService{Address: addr, Meta: map[string]string{QUICPortMeta: port}}}
	}
	must.Eq(t, "10.0.0.1:7379", quicAddr(entry("10.0.0.1", "7379")))
	must.Eq(t, "kv-1.dc2.example:7379", quicAddr(entry("kv-1.dc2.example", "7379")))
	must.Eq(t, "[fd00::1]:7379", quicAddr(entry("fd00::1", "7379")))
	for _, bad := range []*consulapi.ServiceEntry{
		entry("10.0.0.1", "0"), entry("10.0.0.1", "70000"), entry("10.0.0.1", "x"),
		entry("10.0.0.1:99", "7379"), entry("host name", "7379"), entry("-x.example", "7379"),
		entry(strings.Repeat("a", 64)+".example", "7379"), entry("", "7379"), {},
	} {
		must.Eq(t, "", quicAddr(bad), must.Sprintf("%+v", bad.Service))
	}
}

// TestFrozenRemoteConsulGoesStale runs WatchConsul against an HTTP server
// standing in for a Consul agent whose remote datacenter hangs: the remote
// watch is marked stale within its query timeout, logs it once, keeps its
// peers, and the local watch answers meanwhile.
func TestFrozenRemoteConsulGoesStale(t *testing.T) {
	var frozen atomic.Bool
	client := stubConsul(t, &frozen)
	var logs syncBuffer
	local, remote, staleCh := make(chan []string, 100), make(chan []string, 100), make(chan bool, 10)
	var failures atomic.Int64
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		WatchConsul(ctx, ConsulConfig{Client: client, Service: "oasis-kvcached", Set: func(a []string) { local <- a }})
	}()
	go func() {
		defer wg.Done()
		WatchConsul(ctx, ConsulConfig{Client: client, Service: "oasis-kvcached", Datacenter: "dc2", QueryTimeout: 400 * time.Millisecond,
			Logger: hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Info}),
			Set:    func(a []string) { remote <- a }, Stale: func(s bool) { staleCh <- s },
			Queried: func(err error) {
				if err != nil {
					failures.Add(1)
				}
			}})
	}()
	defer func() { cancel(); wg.Wait() }()
	recv := func(ch chan []string, what string) []string {
		select {
		case a := <-ch:
			return a
		case <-time.After(5 * time.Second):
			t.Fatalf("no %s peers; logs:\n%s", what, logs.String())
			return nil
		}
	}
	must.Eq(t, []string{"10.0.0.1:7379"}, recv(local, "local"))
	must.Eq(t, []string{"10.0.2.1:7379"}, recv(remote, "remote"))
	must.StrContains(t, logs.String(), "not valid in the remote datacenter")

	frozen.Store(true)
	start := time.Now()
	select {
	case s := <-staleCh:
		must.True(t, s)
	case <-time.After(3 * time.Second):
		t.Fatal("the frozen datacenter was never marked stale")
	}
	must.Less(t, 1200*time.Millisecond, time.Since(start)) // a blocking query's wait plus one timeout at most
	// Two more failed queries: still one warning.
	failed := failures.Load()
	testutil.Eventually(t, 10*time.Second, "two more failed WAN queries", func() bool { return failures.Load() >= failed+2 })
	must.Eq(t, 1, strings.Count(logs.String(), "is not answering"))
	must.Eq(t, 0, len(remote), must.Sprint("a stale datacenter's peer set was changed"))

	frozen.Store(false)
	testutil.EventuallyEvery(t, 5*time.Second, 20*time.Millisecond, "the datacenter to be reported fresh again", func() bool {
		select {
		case s := <-staleCh:
			return !s
		default:
			return false
		}
	})
}

// stubConsul is an HTTP server standing in for a Consul agent: one
// kvcached instance in the local datacenter and one in dc2, whose queries
// hang while frozen; the token is unknown in dc2.
func stubConsul(t *testing.T, frozen *atomic.Bool) *consulapi.Client {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/acl/token/self" {
			http.Error(w, "rpc error making call: token does not exist: ACL not found", http.StatusForbidden)
			return
		}
		dc := r.URL.Query().Get("dc")
		if dc != "" && r.URL.Query().Get("near") != "_agent" {
			http.Error(w, "a remote query through the streaming backend never sees a freeze", http.StatusBadRequest)
			return
		}
		hang := frozen.Load() && dc == "dc2"
		if hang {
			<-r.Context().Done()
			return
		}
		if r.URL.Query().Get("index") != "" {
			time.Sleep(20 * time.Millisecond) // a blocking query that saw no change
		}
		host := map[string]string{"": "10.0.0.1", "dc2": "10.0.2.1"}[dc]
		w.Header().Set("X-Consul-Index", "7")
		w.Header().Set("X-Consul-KnownLeader", "true")
		w.Header().Set("X-Consul-LastContact", "0")
		w.Write([]byte(`[{"Service":{"Address":"` + host + `","Meta":{"oasis_quic_port":"7379"}}}]`))
	}))
	t.Cleanup(srv.Close)
	cc := consulapi.DefaultConfig()
	cc.Address = strings.TrimPrefix(srv.URL, "http://")
	client, err := consulapi.NewClient(cc)
	must.NoError(t, err)
	return client
}

// syncBuffer is a bytes.Buffer safe for a logger and a test to share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
