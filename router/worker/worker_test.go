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
