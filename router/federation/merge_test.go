package federation

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
	"github.com/oasis-llm/oasis/router/policy"
)

// One federation summary per datacenter: two routers of dc1, each pushing
// its own summary over HTTP/3 with its datacenter's certificate, and a
// router of dc2 that sees dc1's whole load (their sum), not whichever
// pushed last; once one of them stops pushing, its part leaves the sum
// within summary_stale.
func TestPeerSumsADatacentersRouters(t *testing.T) {
	ca := tlsfilestest.NewCA(t, "federation")
	stale := func() policy.FederationSettings {
		s := enabled()
		s.SummaryStale = 500 * time.Millisecond
		return s
	}
	b := startFed(t, Config{DC: "dc2", Identity: testIdentity(t, ca, "dc2"), Listen: "127.0.0.1:0", Policy: stale})
	peer := []Peer{{DC: "dc2", Addr: b.Addr().String(), Models: []string{"m"}}}
	a1 := startFed(t, Config{DC: "dc1", Name: "router-1", Identity: testIdentity(t, ca, "dc1"), Listen: "127.0.0.1:0",
		StaticPeers: peer, Policy: stale, Local: func() []ModelSummary {
			return []ModelSummary{{Model: "m", InFlight: 3, Queued: 1, Free: 1, TTFT: 10 * time.Millisecond}}
		}})
	a2, err := New(Config{DC: "dc1", Name: "router-2", Identity: testIdentity(t, ca, "dc1"), Listen: "127.0.0.1:0",
		StaticPeers: peer, Policy: stale, Handler: echo, Interval: 50 * time.Millisecond, Local: func() []ModelSummary {
			return []ModelSummary{{Model: "m", InFlight: 5, Queued: 2, Free: 2, TTFT: 30 * time.Millisecond, QueueWait: 40 * time.Millisecond}}
		}})
	must.NoError(t, err)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); a2.Run(ctx) }()
	t.Cleanup(func() { stop(); wg.Wait() })
	must.NoError(t, b.SetStaticPeers([]Peer{{DC: "dc1", Addr: a1.Addr().String()}, {DC: "dc1", Addr: a2.Addr().String()}}))

	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, "dc2 sums dc1's two routers", func() bool {
		_, n, _ := b.Remote("dc1", "m")
		return n == 2
	})
	m, _, ok := b.Remote("dc1", "m")
	must.True(t, ok)
	must.Eq(t, ModelSummary{Model: "m", InFlight: 8, Queued: 3, Free: 3, TTFT: 20 * time.Millisecond, QueueWait: 20 * time.Millisecond}, m,
		must.Sprint("counts summed, times averaged"))

	stop() // router-2 stops pushing: its part leaves the sum
	wg.Wait()
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, "router-2's summary out of the sum", func() bool {
		_, n, _ := b.Remote("dc1", "m")
		return n == 1
	})
	m, _, _ = b.Remote("dc1", "m")
	must.Eq(t, uint32(3), m.InFlight, must.Sprint("router-1's alone"))
}

func TestMergedSums(t *testing.T) {
	now := time.Now()
	const fresh = time.Second
	rd := &remoteDC{}
	must.True(t, rd.store("r1", map[string]ModelSummary{"m": {Model: "m", InFlight: 1, Free: FreeUnlimited, TTFT: time.Second}}, now.Add(-3*time.Second), fresh))
	must.True(t, rd.store("r2", map[string]ModelSummary{"m": {Model: "m", InFlight: 2, Free: FreeUnlimited, TTFT: 3 * time.Second}}, now, fresh))
	must.True(t, rd.store("r3", map[string]ModelSummary{"m": {Model: "m", InFlight: 4, Free: 7, TTFT: time.Second}}, now.Add(-time.Millisecond), fresh))

	m, _, n, ok := rd.merged("m", nil, now, fresh)
	must.True(t, ok)
	must.Eq(t, 2, n, must.Sprint("r1 is stale"))
	must.Eq(t, ModelSummary{Model: "m", InFlight: 6, Free: FreeUnlimited, TTFT: 2 * time.Second}, m, must.Sprint("free saturates at unlimited"))

	// None fresh: the newest stands alone, not usable.
	m, _, n, ok = rd.merged("m", nil, now.Add(time.Hour), fresh)
	must.True(t, ok)
	must.Eq(t, 0, n)
	must.Eq(t, uint32(2), m.InFlight, must.Sprint("r2's, the newest"))
	_, _, _, ok = rd.merged("other", nil, now, fresh)
	must.False(t, ok)
}

// A datacenter holds at most MaxRoutersPerDC routers' summaries: a new one
// past it is refused while all are fresh, and takes the place of stale ones.
func TestRoutersPerDCBounded(t *testing.T) {
	now := time.Now()
	rd := &remoteDC{}
	for i := range MaxRoutersPerDC {
		must.True(t, rd.store(fmt.Sprintf("router-%d", i), nil, now, time.Second))
	}
	must.False(t, rd.store("one too many", nil, now, time.Second))
	must.True(t, rd.store("one too many", nil, now.Add(2*time.Second), time.Second), must.Sprint("the stale ones make room"))
	must.Eq(t, 1, len(rd.routers))
}

func TestRouterNames(t *testing.T) {
	for name, ok := range map[string]bool{"": true, "oasis-router-10-0-0-1-8080": true, "a b": false, "ü": false,
		"x\n": false, strings.Repeat("x", maxRouterName): true, strings.Repeat("x", maxRouterName+1): false} {
		must.Eq(t, ok, checkRouterName(name) == nil, must.Sprintf("%q", name))
	}
	id := testIdentity(t, tlsfilestest.NewCA(t, "federation"), "dc1")
	_, err := New(Config{DC: "dc1", Name: "a b", Identity: id, Policy: enabled, Local: func() []ModelSummary { return nil }})
	must.ErrorContains(t, err, "Config.Name")
}
