package worker

import (
	"testing"
	"time"

	"github.com/shoenig/test/must"
)

// The peers' requests (router/peers) count in a worker's load and prefill
// queue, as the load and ttft terms read them.
func TestSignalsAddPeers(t *testing.T) {
	cases := []struct {
		name     string
		s        Signals
		load     float64
		ttft     time.Duration // of 1000 uncached tokens
		uncached int64
	}{
		{"own only", Signals{InFlight: 2, PendingPrefillTokens: 1000, PrefillRate: 1000}, 2, 2 * time.Second, 1000},
		{"peers added", Signals{InFlight: 2, PeerInFlight: 3, PendingPrefillTokens: 1000, PeerPendingPrefillTokens: 2000, PrefillRate: 1000},
			5, 4 * time.Second, 1000},
		{"engine figures larger", Signals{InFlight: 1, PeerInFlight: 1, EngineMetrics: true, Running: 4, Waiting: 2, PrefillRate: 1000}, 6, time.Second, 1000},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			must.Eq(t, tc.load, tc.s.Load())
			must.Eq(t, tc.ttft, tc.s.EstimatedTTFT(tc.uncached))
		})
	}
	l := NewLive()
	l.SetPeers(4, 500)
	s := l.Snapshot()
	must.Eq(t, int64(4), s.PeerInFlight)
	must.Eq(t, int64(500), s.PeerPendingPrefillTokens)
	l.SetPeers(-1, -1)
	s = l.Snapshot()
	must.Eq(t, int64(0), s.PeerInFlight, must.Sprint("never negative"))
}

// OnChange is called after each change of the router's own requests on the
// worker (what router/peers sends on), and not for the peers' or the
// engine's figures.
func TestOnChangeFollowsOwnRequests(t *testing.T) {
	l := NewLive()
	calls := 0
	var seen []int64 // in flight + pending prefill, as the hook saw them
	l.OnChange(func() {
		calls++
		s := l.Snapshot()
		seen = append(seen, s.InFlight*1000+s.PendingPrefillTokens)
	})
	end := l.Begin(10)
	pf := l.StartPrefill(100)
	l.SetPeers(5, 500)
	l.SetEngine(1, 0, 0.5, time.Time{})
	pf.FirstToken(time.Second)
	pf.Cancel() // already ended: no change
	end()
	end() // once
	l.Enter(1)
	l.Leave(1)
	must.Eq(t, []int64{1000, 1100, 1000, 0, 1000, 0}, seen)
	l.OnChange(nil)
	l.Begin(1)()
	must.Eq(t, 6, calls)
}
