package peers

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

func TestSchedule(t *testing.T) {
	ms := time.Millisecond
	cases := []struct {
		name  string
		steps func(s *Schedule)
		next  time.Duration
	}{
		{"nothing sent yet: due at once", func(*Schedule) {}, 0},
		{"sent, no change: the heartbeat", func(s *Schedule) { s.Sent(100 * ms) }, 300 * ms},
		{"a change: MinInterval after the last message", func(s *Schedule) { s.Sent(100 * ms); s.Changed() }, 110 * ms},
		{"changes coalesce", func(s *Schedule) { s.Sent(100 * ms); s.Changed(); s.Changed() }, 110 * ms},
		{"a change sent: the heartbeat again", func(s *Schedule) { s.Sent(100 * ms); s.Changed(); s.Sent(110 * ms) }, 310 * ms},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := Schedule{Interval: 200 * ms, MinInterval: 10 * ms}
			tc.steps(&s)
			must.Eq(t, tc.next, s.Next())
		})
	}
}

// A change goes out at once, not at the next heartbeat: with a 5 s
// heartbeat, r0 hears of r1's new request within a second (after the
// messages each router sends a peer that joins).
func TestChangeSentBeforeHeartbeat(t *testing.T) {
	c, _ := testutil.StartConsul(t)
	slow := func(cfg *Config) { cfg.Interval, cfg.MinInterval = 5*time.Second, 10*time.Millisecond }
	ns := []*node{startNode(t, c, "oasis-router-h0", nil, slow), startNode(t, c, "oasis-router-h1", nil, slow)}
	testutil.Eventually(t, 15*time.Second, "two routers gossiping", func() bool {
		return ns[0].gossiping() == 2 && ns[1].gossiping() == 2
	})
	// Joined: wait for the messages that follow the join to be applied,
	// then the next heartbeat is seconds away.
	testutil.Eventually(t, 10*time.Second, "r0 has r1's (empty) load", func() bool {
		ns[0].Peers.mu.Lock()
		defer ns[0].Peers.mu.Unlock()
		_, ok := ns[0].Peers.loads["oasis-router-h1"]
		return ok
	})
	ns[1].setLoad(Load{Engines: map[string]EngineLoad{"e1": {InFlight: 1, PendingPrefill: 300}}})
	ns[1].Changed()
	start := time.Now()
	testutil.EventuallyEvery(t, time.Second, time.Millisecond, "r0 hears of r1's change before the heartbeat", func() bool {
		return ns[0].EngineLoads()["e1"] == EngineLoad{InFlight: 1, PendingPrefill: 300}
	})
	t.Logf("r1's change reached r0 in %v", time.Since(start).Round(time.Microsecond))
}
