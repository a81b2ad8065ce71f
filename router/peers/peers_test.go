package peers

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// node is one Peers running, with a load the test sets.
type node struct {
	*Peers
	name   string
	mu     sync.Mutex
	load   Load
	cancel context.CancelFunc
	done   chan struct{}
}

func (n *node) setLoad(l Load) {
	n.mu.Lock()
	n.load = l
	n.mu.Unlock()
}

// startNode (opts change its Config) registers name in Consul with its gossip address and runs its
// Peers until the test ends (or stop).
func startNode(t *testing.T, c *consulapi.Client, name string, key []byte, opts ...func(*Config)) *node {
	t.Helper()
	n := &node{name: name, done: make(chan struct{})}
	cfg := Config{Name: name, Consul: c, Key: key, Interval: 50 * time.Millisecond,
		Local: func() Load { n.mu.Lock(); defer n.mu.Unlock(); return n.load }}
	for _, o := range opts {
		o(&cfg)
	}
	p, err := New(cfg)
	must.NoError(t, err)
	n.Peers = p
	// Registered under another id than its gossip name, as the Nomad job
	// registers it: the gossip address makes them one router.
	must.NoError(t, c.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{ID: "_nomad-task-" + name, Name: DefaultService,
		Address: "127.0.0.1", Port: 1, Meta: map[string]string{MetaAddr: p.Addr()}}))
	ctx, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	go func() { defer close(n.done); _ = p.Run(ctx) }()
	t.Cleanup(n.stop)
	return n
}

func (n *node) stop() {
	n.cancel()
	<-n.done
}

func (n *node) gossiping() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.Peers.mu.Lock()
	defer n.Peers.mu.Unlock()
	return len(n.Peers.gossip) + 1
}

func TestThreeRoutersSplitAndResplit(t *testing.T) {
	c, _ := testutil.StartConsul(t)
	key := []byte("0123456789abcdef0123456789abcdef")
	var ns []*node
	for i := range 3 {
		ns = append(ns, startNode(t, c, fmt.Sprintf("oasis-router-r%d", i), key))
	}
	testutil.Eventually(t, 15*time.Second, "three routers gossiping", func() bool {
		for _, n := range ns {
			if n.gossiping() != 3 || n.Live() != 3 {
				return false
			}
		}
		return true
	})
	// Idle: an even split of 9.
	for _, n := range ns {
		must.Eq(t, 3, n.ModelShare("m", 9))
	}
	// r1 and r2 run 4 each and queue 6: r0, idle, gets nothing now (one
	// slot to each router with work, the rest by 1 + demand: 0, 5, 4).
	ns[1].setLoad(Load{Models: map[string]ModelLoad{"m": {InFlight: 4, Queued: 6}}})
	ns[2].setLoad(Load{Models: map[string]ModelLoad{"m": {InFlight: 4, Queued: 6}}})
	testutil.Eventually(t, 5*time.Second, "r0 sees the others' loads", func() bool {
		return ns[0].ModelShare("m", 9) == 0
	})
	// Engine loads are summed over the other routers.
	ns[1].setLoad(Load{Engines: map[string]EngineLoad{"e1": {InFlight: 2, PendingPrefill: 100}}})
	ns[2].setLoad(Load{Engines: map[string]EngineLoad{"e1": {InFlight: 1, PendingPrefill: 50}, "e2": {InFlight: 4}}})
	testutil.Eventually(t, 5*time.Second, "r0 sums r1's and r2's engine loads", func() bool {
		l := ns[0].EngineLoads()
		return l["e1"] == EngineLoad{InFlight: 3, PendingPrefill: 150} && l["e2"] == EngineLoad{InFlight: 4}
	})
	// A key asked at 10/s on r1 only: r1 gets most of its rate.
	// Once r0 has work too, it gets a slot.
	ns[0].setLoad(Load{Models: map[string]ModelLoad{"m": {Queued: 1}}})
	testutil.Eventually(t, 5*time.Second, "r1 and r2 make room for r0", func() bool {
		ns[1].setLoad(Load{Models: map[string]ModelLoad{"m": {InFlight: min(4, ns[1].ModelShare("m", 9)), Queued: 6}}})
		ns[2].setLoad(Load{Models: map[string]ModelLoad{"m": {InFlight: min(4, ns[2].ModelShare("m", 9)), Queued: 6}}})
		return ns[0].ModelShare("m", 9) == 1
	})
	// Engine loads are summed over the other routers.
	ns[1].setLoad(Load{Engines: map[string]EngineLoad{"e1": {InFlight: 2, PendingPrefill: 100}}})
	ns[2].setLoad(Load{Engines: map[string]EngineLoad{"e1": {InFlight: 1, PendingPrefill: 50}, "e2": {InFlight: 4}}})
	testutil.Eventually(t, 5*time.Second, "r0 sums r1's and r2's engine loads", func() bool {
		l := ns[0].EngineLoads()
		return l["e1"] == EngineLoad{InFlight: 3, PendingPrefill: 150} && l["e2"] == EngineLoad{InFlight: 4}
	})
	// A key asked at 10/s on r1 only: r1 gets most of its rate.
	ns[1].setLoad(Load{Keys: map[string]float64{"team": 10}})
	testutil.Eventually(t, 5*time.Second, "r0 sees r1's key rate", func() bool {
		return ns[0].KeyFraction("team") < 0.1
	})

	// r2 stops and leaves Consul: the others re-split over two.
	start := time.Now()
	ns[2].stop()
	must.NoError(t, c.Agent().ServiceDeregister("_nomad-task-"+ns[2].name))
	testutil.Eventually(t, 10*time.Second, "two routers left", func() bool {
		return ns[0].Live() == 2 && ns[1].Live() == 2
	})
	t.Logf("re-split over 2 routers %v after r2 left", time.Since(start).Round(time.Millisecond))
	ns[1].setLoad(Load{})
	testutil.Eventually(t, 5*time.Second, "an even split of 9 over 2", func() bool {
		ns[0].setLoad(Load{})
		a, b := ns[0].ModelShare("m", 9), ns[1].ModelShare("m", 9)
		return a+b == 9 && min(a, b) == 4 // the extra slot to the lower address
	})
}

// Priority across routers over real gossip: r1 queues band 0 work, r0
// band 3: once each has the other's message, r0's part is the whole cap
// and r1's nothing; when r0's queue empties, r1's part comes back.
func TestHigherBandWinsTheSplit(t *testing.T) {
	c, _ := testutil.StartConsul(t)
	ns := []*node{startNode(t, c, "oasis-router-b0", nil), startNode(t, c, "oasis-router-b1", nil)}
	testutil.Eventually(t, 15*time.Second, "two routers gossiping", func() bool {
		return ns[0].gossiping() == 2 && ns[1].gossiping() == 2
	})
	ns[1].setLoad(Load{Models: map[string]ModelLoad{"m": {Queued: 10, Band: 0}}})
	ns[0].setLoad(Load{Models: map[string]ModelLoad{"m": {Queued: 2, Band: 3}}})
	testutil.Eventually(t, 5*time.Second, "the cap to the higher band", func() bool {
		return ns[0].ModelShare("m", 8) == 8 && ns[1].ModelShare("m", 8) == 0
	})
	ns[0].setLoad(Load{})
	testutil.Eventually(t, 5*time.Second, "the lower band's part back", func() bool {
		return ns[1].ModelShare("m", 8) > 4
	})
}

// A router cut off from gossip while still registered keeps its share of
// the budget, never the whole of it; its peers keep counting it.
func TestPartitionedRouterKeepsItsShare(t *testing.T) {
	c, _ := testutil.StartConsul(t)
	var ns []*node
	for i := range 3 {
		ns = append(ns, startNode(t, c, fmt.Sprintf("oasis-router-p%d", i), nil))
	}
	testutil.Eventually(t, 15*time.Second, "three routers gossiping", func() bool {
		return ns[0].gossiping() == 3 && ns[1].gossiping() == 3 && ns[2].gossiping() == 3
	})
	// p2's gossip stops (its listener gone), its registration stays.
	ns[2].stop()
	testutil.Eventually(t, 15*time.Second, "p0 and p1 see p2 failed", func() bool {
		return ns[0].gossiping() == 2 && ns[1].gossiping() == 2
	})
	for _, n := range ns[:2] {
		must.Eq(t, 3, n.Live(), must.Sprint("a registered router still counts"))
		must.Eq(t, 3, n.ModelShare("m", 9), must.Sprint("never more than cap ÷ registered routers"))
	}
	// Busy with a key, p0 and p1 still leave p2 its third of the rate.
	for _, n := range ns[:2] {
		n.setLoad(Load{Keys: map[string]float64{"team": 10}})
	}
	testutil.Eventually(t, 5*time.Second, "a third of the key's rate each", func() bool {
		f0, f1 := ns[0].KeyFraction("team"), ns[1].KeyFraction("team")
		return math.Abs(f0-1.0/3) < 1e-9 && math.Abs(f1-1.0/3) < 1e-9
	})
}

func TestNewRefusesInsecureOrInvalid(t *testing.T) {
	c, err := consulapi.NewClient(consulapi.DefaultConfig())
	must.NoError(t, err)
	local := func() Load { return Load{} }
	cases := []struct {
		name string
		cfg  Config
		want error
	}{
		{"no key off loopback", Config{Name: "r", Consul: c, Local: local, Bind: "0.0.0.0:0"}, ErrInsecure},
		{"bad key length", Config{Name: "r", Consul: c, Local: local, Key: []byte("short")}, ErrConfig},
		{"no name", Config{Consul: c, Local: local}, ErrConfig},
		{"no consul", Config{Name: "r", Local: local}, ErrConfig},
		{"no local", Config{Name: "r", Consul: c}, ErrConfig},
		{"bad bind", Config{Name: "r", Consul: c, Local: local, Bind: "127.0.0.1"}, ErrConfig},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(tc.cfg)
			must.True(t, errors.Is(err, tc.want), must.Sprintf("got %v", err))
		})
	}
}
