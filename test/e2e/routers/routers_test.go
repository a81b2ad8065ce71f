package routers

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// maxInFlightOvershoot is the overshoot of max_in_flight ARCHITECTURE.md
// states for a datacenter's routers ("What the routers of a datacenter
// share").
const maxInFlightOvershoot = 1

// Three routers, max_in_flight k, bursts through all three at once: the
// engine never runs more than k + the stated overshoot (each router alone
// would let k through: 3k).
func TestMaxInFlightHoldsAcrossRouters(t *testing.T) {
	const k, per, bursts = 4, 6, 20
	e := newEngine(t, 50*time.Millisecond)
	c := startCluster(t, 3, e, fmt.Sprintf(`{"policy":"round_robin","admission":{"max_in_flight":%d,"max_queue":100,"queue_timeout":"30s"}}`, k), "")
	worst := int64(0)
	var peaks []int64
	for range bursts {
		e.peak.Store(0)
		counts := burst(c.routers, per)
		must.Eq(t, map[int]int{http.StatusOK: 3 * per}, counts)
		peaks = append(peaks, e.peak.Load())
		worst = max(worst, e.peak.Load())
	}
	t.Logf("max_in_flight %d, 3 routers, %d bursts of %d requests: engine peaks %v (worst %d, overshoot %d)",
		k, bursts, 3*per, peaks, worst, worst-k)
	must.LessEq(t, int64(k+maxInFlightOvershoot), worst)
	must.Eq(t, int64(bursts*3*per), e.served.Load())
}

// A key limited to r requests a second (burst b) across 3 routers: the
// requests admitted stay within b + r·T (+1 per router: a router's bucket
// holds at least one token).
func TestKeyRateHoldsAcrossRouters(t *testing.T) {
	const r, b = 10, 10
	e := newEngine(t, time.Millisecond)
	keys := fmt.Sprintf(`{"keys":[{"id":"team","sha256":%q,"rate_per_second":%d,"burst":%d}]}`, digest(apiKey), r, b)
	c := startCluster(t, 3, e, `{"policy":"round_robin"}`, keys)
	const window = 3 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), window)
	defer cancel()
	start := time.Now()
	var mu sync.Mutex
	counts := map[int]int{}
	var wg sync.WaitGroup
	for _, rt := range c.routers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(20 * time.Millisecond) // 50 requests a second to each router
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				s := complete(ctx, rt, apiKey)
				mu.Lock()
				counts[s]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	limit := b + r*elapsed.Seconds() + 3
	t.Logf("key at %d/s (burst %d) through 3 routers for %v: %d admitted (limit %.1f); statuses %v (0: cut at the window's end)",
		r, b, elapsed.Round(time.Millisecond), counts[http.StatusOK], limit, counts)
	must.Positive(t, counts[http.StatusTooManyRequests])
	must.LessEq(t, limit, float64(counts[http.StatusOK]))
	must.Greater(t, float64(r)*elapsed.Seconds()/2, float64(counts[http.StatusOK]), must.Sprint("the limit is shared, not starved"))
}

// A router killed (SIGKILL) and one frozen (SIGSTOP): the others keep
// serving, and once Consul and the gossip have let them go the budget is
// split over those left: the engine runs the whole k again.
func TestRoutersResplitAfterKillAndFreeze(t *testing.T) {
	const k, per = 6, 6
	e := newEngine(t, 200*time.Millisecond)
	c := startCluster(t, 4, e, fmt.Sprintf(`{"policy":"round_robin","admission":{"max_in_flight":%d,"max_queue":100,"queue_timeout":"30s"}}`, k), "")

	must.NoError(t, c.routers[3].Kill())
	freeze(t, c.routers[2])
	start := time.Now()
	survivors := c.routers[:2]
	// While the lost routers still count, the survivors hold their shares.
	counts := burst(survivors, per)
	must.Eq(t, map[int]int{http.StatusOK: 2 * per}, counts)
	must.LessEq(t, int64(k), e.peak.Load())
	c.waitLive(survivors, 2)
	t.Logf("killed and frozen routers let go, budget re-split over 2 routers, %v after the kill", time.Since(start).Round(100*time.Millisecond))
	e.peak.Store(0)
	counts = burst(survivors, per)
	must.Eq(t, map[int]int{http.StatusOK: 2 * per}, counts)
	must.Eq(t, int64(k), e.peak.Load(), must.Sprint("the two left share the whole cap"))
}

// The load term sees the other routers' requests: router A, which knows
// only engine E1, has 3 requests running there; router B (E1 and E2,
// least_load) sends its next 3 to E2. Alone, B would split them 2/1 or 1/2
// between the engines it sees idle.
func TestLoadTermSeesPeersRequests(t *testing.T) {
	e1, e2 := newEngine(t, 3*time.Second), newEngine(t, 3*time.Second)
	a1, a2 := strings.TrimPrefix(e1.URL, "http://"), strings.TrimPrefix(e2.URL, "http://")
	// Static instance ids are by position: E1 is static-0-<addr> on both.
	c := startRouters(t, `{"policy":"least_load"}`, "", "m="+a1, "m="+a1+",m="+a2)
	a, b := c.routers[0], c.routers[1]
	var wg sync.WaitGroup
	send := func(r *router) {
		wg.Add(1)
		go func() { defer wg.Done(); must.Eq(t, http.StatusOK, complete(context.Background(), r, "")) }()
	}
	for range 3 {
		send(a)
	}
	testutil.Eventually(t, 10*time.Second, "B hears of A's 3 requests on E1", func() bool {
		return e1.inFlight.Load() == 3 && b.metric("oasis_router_peers_in_flight", nil) == 3
	})
	for range 3 {
		send(b)
	}
	testutil.Eventually(t, 10*time.Second, "B's requests on an engine", func() bool {
		return e1.inFlight.Load()+e2.inFlight.Load() == 6
	})
	must.Eq(t, int64(3), e2.inFlight.Load(), must.Sprint("B sent its requests to the engine A's do not load"))
	wg.Wait()
}
