package peers

import (
	"context"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// startCounter runs a CountOnly Peers named name with API port port (and
// Nomad node id node) until the test ends.
func startCounter(t *testing.T, c *consulapi.Client, name string, port int, node string) *Peers {
	t.Helper()
	p, err := New(Config{Name: name, CountOnly: true, Ports: []int{port}, Node: node, Consul: c, Local: func() Load { return Load{} }})
	must.NoError(t, err)
	must.Eq(t, "", p.Addr(), must.Sprint("no gossip listener"))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = p.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return p
}

func register(t *testing.T, c *consulapi.Client, id string, port int, meta map[string]string) {
	t.Helper()
	must.NoError(t, c.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{ID: id, Name: DefaultService,
		Address: "127.0.0.1", Port: port, Meta: meta}))
}

// Without gossip, each router counts the datacenter's routers from their
// Consul registrations and keeps its even share of a cap: three routers
// (one registered by itself under its own name, two as the Nomad job
// registers them, one of those with its mesh listener too) admit 9 of 9,
// not 27; one deregistered, the two left split the cap between them.
func TestCountOnlyRoutersKeepTheirShare(t *testing.T) {
	c, _ := testutil.StartConsul(t)
	register(t, c, "oasis-router-a", 9001, nil)
	register(t, c, "_nomad-task-b-http", 9002, map[string]string{MetaNode: "node-b"})
	register(t, c, "_nomad-task-b-mesh", 9102, map[string]string{MetaNode: "node-b"})
	register(t, c, "_nomad-task-c-http", 9003, map[string]string{MetaNode: "node-c"})
	// The job's router names itself after its loopback listener, not its
	// registration's id: b is found on its Consul node at its port, c by
	// its Nomad node id (-peers-node).
	ps := []*Peers{
		startCounter(t, c, "oasis-router-a", 9001, ""),
		startCounter(t, c, "oasis-router-127-0-0-1-9002", 9002, ""),
		startCounter(t, c, "oasis-router-127-0-0-1-8080", 0, "node-c"),
	}
	testutil.Eventually(t, 10*time.Second, "three routers counted", func() bool {
		for _, p := range ps {
			if p.Live() != 3 {
				return false
			}
		}
		return true
	})
	cases := []struct{ limit, sum int }{{9, 9}, {10, 10}, {2, 2}, {1, 1}}
	for _, tc := range cases {
		sum := 0
		for _, p := range ps {
			share := p.ModelShare("m", tc.limit)
			must.LessEq(t, (tc.limit+2)/3, share, must.Sprintf("cap %d: a router's share", tc.limit))
			sum += share
		}
		must.Eq(t, tc.sum, sum, must.Sprintf("cap %d: the shares sum to the cap", tc.limit))
	}
	for _, p := range ps {
		must.Eq(t, 1.0/3, p.KeyFraction("team"))
	}

	must.NoError(t, c.Agent().ServiceDeregister("_nomad-task-c-http"))
	testutil.Eventually(t, 10*time.Second, "two routers counted", func() bool {
		return ps[0].Live() == 2 && ps[1].Live() == 2
	})
	must.Eq(t, 9, ps[0].ModelShare("m", 9)+ps[1].ModelShare("m", 9))
}

// A router alone (no registration of its own yet, none of others) keeps
// the whole cap.
func TestCountOnlyRouterAlone(t *testing.T) {
	c, _ := testutil.StartConsul(t)
	p := startCounter(t, c, "oasis-router-alone", 9001, "")
	register(t, c, "oasis-router-alone", 9001, nil)
	testutil.Eventually(t, 10*time.Second, "its own registration seen", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		_, ok := p.registered["oasis-router-alone"]
		return ok
	})
	must.Eq(t, 1, p.Live())
	must.Eq(t, 7, p.ModelShare("m", 7))
}
