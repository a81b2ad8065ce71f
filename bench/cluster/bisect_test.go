package cluster

import (
	"strings"
	"testing"
)

// TestPeerTargetsThroughputAtTheGoal: a rate exactly 1.25 times the best
// peer's by scale meets the goal, though the rates' float ratio is just
// below it, and a rate just below does not.
func TestPeerTargetsThroughputAtTheGoal(t *testing.T) {
	const n, span = 20000, 3349.981 // gen:chat's 20,000 requests over its span at scale 1
	bis := func(policy string, scale float64) Bisection {
		return Bisection{Policy: policy, Scale: scale, Best: Result{Policy: policy, RateScale: scale, Rate: n / (span / scale)}}
	}
	for _, c := range []struct {
		oasis, peer float64
		met         bool
	}{
		{40, 32, true},
		{39.9, 32, false},
		{48, 32, true},
	} {
		targets := PeerTargets([]Bisection{bis(PolicyOasis, c.oasis), bis("llmd", c.peer)}, Result{}, nil, nil, DefaultRoutingSLO())
		var found bool
		for _, tg := range targets {
			if strings.HasPrefix(tg.Name, "throughput at SLO oasis / best peer") {
				found = true
				if tg.Met != c.met {
					t.Errorf("%g× against %g×: ratio %.17g met %v, want %v", c.oasis, c.peer, tg.Measured, tg.Met, c.met)
				}
			}
		}
		if !found {
			t.Fatalf("no throughput target in %+v", targets)
		}
	}
}
