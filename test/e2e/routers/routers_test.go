package routers

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
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

// Without gossip (the Nomad job's default: no -peers-listen), each router
// counts the routers registered in Consul and keeps its share of the cap:
// 3 routers, max_in_flight k, bursts through all three: the engine never
// runs more than k (each router alone would let k through: 3k).
func TestRoutersWithoutGossipKeepTheirShare(t *testing.T) {
	const k, per, bursts = 6, 6, 5
	e := newEngine(t, 50*time.Millisecond)
	c := newCluster(t, fmt.Sprintf(`{"policy":"round_robin","admission":{"max_in_flight":%d,"max_queue":100,"queue_timeout":"30s"}}`, k), "", false)
	for range 3 {
		c.start("m=" + strings.TrimPrefix(e.URL, "http://"))
	}
	c.waitLive(c.routers, 3)
	worst := int64(0)
	for range bursts {
		e.peak.Store(0)
		must.Eq(t, map[int]int{http.StatusOK: 3 * per}, burst(c.routers, per))
		worst = max(worst, e.peak.Load())
	}
	t.Logf("max_in_flight %d, 3 routers without gossip, %d bursts of %d requests: engine peak %d", k, bursts, 3*per, worst)
	must.LessEq(t, int64(k), worst)
	for _, r := range c.routers {
		must.Eq(t, 0.0, r.metric("oasis_router_peers_gossip", nil), must.Sprint("no gossip"))
	}
}

// A key limited to r requests a second (burst b) across 3 routers: the
// requests admitted stay within b + r·T (+1 per router: a router's bucket
// holds at least one token).
func TestKeyRateHoldsAcrossRouters(t *testing.T) {
	const r, b = 10, 10
	e := newEngine(t, time.Millisecond)
	keys := fmt.Sprintf(`{"keys":[{"id":"team","sha256":%q,"rate_per_second":%d,"burst":%d}]}`, digest(apiKey), r, b)
	c := startCluster(t, 3, e, `{"policy":"round_robin"}`, keys)
	counts, elapsed := paced(c.routers, apiKey, 3*time.Second)
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

// A key limited to t tokens a minute across 3 routers (usage from the
// engine: 4 tokens a request): the tokens admitted stay within t + the
// window's refill + one request in flight per router (charged at its end).
func TestKeyTokensPerMinuteHoldAcrossRouters(t *testing.T) {
	const tpm, perRequest = 120, 4
	e := newEngine(t, time.Millisecond)
	keys := fmt.Sprintf(`{"keys":[{"id":"team","sha256":%q,"tokens_per_minute":%d}]}`, digest(apiKey), tpm)
	c := startCluster(t, 3, e, `{"policy":"round_robin"}`, keys)
	counts, elapsed := paced(c.routers, apiKey, 3*time.Second)
	limit := (tpm+tpm/60*elapsed.Seconds())/perRequest + 3
	t.Logf("key at %d tokens/min through 3 routers for %v: %d requests admitted (%d tokens; limit %.1f requests); statuses %v",
		tpm, elapsed.Round(time.Millisecond), counts[http.StatusOK], counts[http.StatusOK]*perRequest, limit, counts)
	must.Positive(t, counts[http.StatusTooManyRequests])
	must.LessEq(t, limit, float64(counts[http.StatusOK]))
	m := c.routers[0].metric("oasis_router_key_tokens_total", map[string]string{"key": "team"})
	must.Positive(t, m, must.Sprint("per-key tokens counted"))
}

// At saturation (max_in_flight 1) the admission queue serves the higher
// priority band first, and two keys of one band in turn, whatever their
// arrival order: asserted from the order the engine saw them in.
func TestPriorityBandsAndFairShares(t *testing.T) {
	e := newEngine(t, 20*time.Millisecond)
	var specs []string
	for _, k := range []struct {
		id   string
		prio int
	}{{"low", 0}, {"high", 5}, {"a", 2}, {"b", 2}, {"blocker", 9}} {
		specs = append(specs, fmt.Sprintf(`{"id":%q,"sha256":%q,"priority":%d}`, k.id, digest("sk-"+k.id), k.prio))
	}
	c := startCluster(t, 1, e, `{"policy":"round_robin","admission":{"max_in_flight":1,"max_queue":100,"queue_timeout":"60s"}}`,
		`{"keys":[`+strings.Join(specs, ",")+`]}`)
	r := c.routers[0]
	var wg sync.WaitGroup
	send := func(key string, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				must.Eq(t, http.StatusOK, completePrompt(context.Background(), r, "sk-"+key, key))
			}()
		}
	}
	queued := func(n int) func() bool {
		return func() bool { return r.metric("oasis_router_queued", map[string]string{"model": "m"}) == float64(n) }
	}
	// A long request holds the one slot while the others queue.
	e.mu.Lock()
	e.hold = 2 * time.Second
	e.mu.Unlock()
	send("blocker", 1)
	testutil.Eventually(t, 10*time.Second, "the blocker on the engine", func() bool { return e.inFlight.Load() == 1 })
	e.mu.Lock()
	e.hold = 20 * time.Millisecond
	e.mu.Unlock()
	send("low", 4)
	testutil.Eventually(t, 10*time.Second, "low queued", queued(4))
	send("a", 6)
	testutil.Eventually(t, 10*time.Second, "a queued", queued(10))
	send("b", 3)
	send("high", 2)
	testutil.Eventually(t, 10*time.Second, "all queued", queued(15))
	wg.Wait()
	e.mu.Lock()
	got := e.prompts[1:]
	e.mu.Unlock()
	t.Logf("engine order after the blocker: %v", got)
	must.Eq(t, []string{"high", "high"}, got[:2], must.Sprint("band 5 first"))
	must.Eq(t, []string{"a", "b", "a", "b", "a", "b", "a", "a", "a"}, got[2:11], must.Sprint("band 2: a and b in turn"))
	must.Eq(t, []string{"low", "low", "low", "low"}, got[11:], must.Sprint("band 0 last"))
}

// A router partitioned from the others' gossip (here: another gossip key,
// so no message passes either way) while Consul still lists it: it keeps
// its share of max_in_flight (cap ÷ 3), never the whole cap, and the
// others keep theirs: the engine never runs more than k.
func TestPartitionedRouterFallsBackToItsShare(t *testing.T) {
	const k, per = 6, 6
	e := newEngine(t, 200*time.Millisecond)
	c := startCluster(t, 2, e, fmt.Sprintf(`{"policy":"round_robin","admission":{"max_in_flight":%d,"max_queue":100,"queue_timeout":"30s"}}`, k), "")
	other := filepath.Join(t.TempDir(), "other.key")
	must.NoError(t, os.WriteFile(other, []byte(base64.StdEncoding.EncodeToString([]byte("another key, 32 bytes long......"))), 0o600))
	c.start("m="+strings.TrimPrefix(e.URL, "http://"), "-peers-key-file", other)
	lone := c.routers[2]
	c.waitLive(c.routers, 3)
	must.Eq(t, 1.0, lone.metric("oasis_router_peers_gossip", nil), must.Sprint("the lone router gossips with nobody"))
	must.Eq(t, 2.0, c.routers[0].metric("oasis_router_peers_gossip", nil))

	e.peak.Store(0)
	counts := burst([]*router{lone}, per)
	must.Eq(t, map[int]int{http.StatusOK: per}, counts)
	must.Eq(t, int64(k/3), e.peak.Load(), must.Sprint("alone, the partitioned router runs its share"))

	e.peak.Store(0)
	counts = burst(c.routers, per)
	must.Eq(t, map[int]int{http.StatusOK: 3 * per}, counts)
	must.LessEq(t, int64(k), e.peak.Load(), must.Sprint("all three: never more than the cap"))
}

// Two routers, one engine without KV events: a long prompt sent through
// router A is known to router B as held by the engine (B's prefix term
// matches its blocks the first time B sees it), from A's prefix records
// over the gossip; a prompt neither sent before matches nothing.
func TestPrefixRecordsSharedForEventlessEngines(t *testing.T) {
	e := newEngine(t, 0)
	c := startCluster(t, 2, e, `{"policy":"weighted","weights":{"prefix":1,"load":0.1}}`, "")
	a, b := c.routers[0], c.routers[1]
	prompt := strings.Repeat("the quick brown fox jumps over the lazy dog ", 60)
	must.Eq(t, http.StatusOK, completePrompt(context.Background(), a, "", prompt))
	must.Positive(t, a.metric("oasis_router_prefix_request_blocks_total", nil))
	fresh := strings.Repeat("an entirely different prompt with its own words ", 60)
	must.Eq(t, http.StatusOK, completePrompt(context.Background(), b, "", fresh))
	must.Eq(t, 0.0, b.metric("oasis_router_prefix_matched_blocks_total", nil), must.Sprint("a prompt never sent matched"))
	// A records the prompt before its answer's body; the next message
	// from A carries it: wait for two.
	seen := b.metric("oasis_router_peer_messages_total", map[string]string{"result": "ok"})
	testutil.Eventually(t, 10*time.Second, "two messages from A at B", func() bool {
		return b.metric("oasis_router_peer_messages_total", map[string]string{"result": "ok"}) >= seen+2
	})
	must.Eq(t, http.StatusOK, completePrompt(context.Background(), b, "", prompt))
	must.Positive(t, b.metric("oasis_router_prefix_matched_blocks_total", nil), must.Sprint("B's first sight of A's prompt matched no block"))
}

// Priority across routers: at saturation, a higher band waiting at one
// router wins the slots a lower band holds at another. Router B runs k
// requests of key "low" (band 0) with many more queued; then key "high"
// (band 5) queues its requests at router A. Once the routers' messages
// carry A's band (one interval), B's part of max_in_flight falls to 0 and
// every slot B frees goes to A: asserted from the engine's order, the low
// requests started after the high ones were sent and before the last of
// them are at most 2k (a round of k before B hears, the hold being longer
// than the gossip interval, and as much again for a late message on a
// loaded host). Split by demand alone, A (8 queued against B's ~30) gets
// about one slot in four and some 20 low requests start first.
func TestPriorityWinsSlotsAcrossRouters(t *testing.T) {
	const k, lows, highs = 4, 40, 8
	e := newEngine(t, 300*time.Millisecond)
	specs := fmt.Sprintf(`{"keys":[{"id":"low","sha256":%q,"priority":0},{"id":"high","sha256":%q,"priority":5}]}`,
		digest("sk-low"), digest("sk-high"))
	c := startCluster(t, 2, e, fmt.Sprintf(`{"policy":"round_robin","admission":{"max_in_flight":%d,"max_queue":100,"queue_timeout":"60s"}}`, k), specs)
	a, b := c.routers[0], c.routers[1]
	var wg sync.WaitGroup
	send := func(r *router, key string, n int) {
		for range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				must.Eq(t, http.StatusOK, completePrompt(context.Background(), r, "sk-"+key, key))
			}()
		}
	}
	send(b, "low", lows)
	testutil.Eventually(t, 10*time.Second, "B running k low requests, most of the rest queued", func() bool {
		return e.inFlight.Load() == k && b.metric("oasis_router_queued", map[string]string{"model": "m"}) >= lows/2
	})
	e.mu.Lock()
	sent := len(e.prompts) // the engine's requests before the high ones were sent
	e.mu.Unlock()
	send(a, "high", highs)
	wg.Wait()
	e.mu.Lock()
	order := slices.Clone(e.prompts)
	e.mu.Unlock()
	lastHigh := -1
	for i, p := range order {
		if p == "high" {
			lastHigh = i
		}
	}
	must.Eq(t, lows+highs, len(order))
	must.Greater(t, sent, lastHigh)
	started := 0 // low requests the engine started after the high ones were sent, before the last high one
	for _, p := range order[sent:lastHigh] {
		if p == "low" {
			started++
		}
	}
	t.Logf("max_in_flight %d; %d low (band 0) at B, then %d high (band 5) at A: %d low started after the high ones were sent and before the last; engine order %v",
		k, lows, highs, started, order[sent:])
	must.LessEq(t, 2*k, started, must.Sprint("the higher band waiting at A did not win B's slots"))
}
