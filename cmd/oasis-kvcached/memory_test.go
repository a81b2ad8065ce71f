package main

import (
	"testing"

	"github.com/shoenig/test/must"
)

func TestPlanMemory(t *testing.T) {
	for _, tc := range []struct {
		ram, maxValue int64
		disk          bool
	}{
		{2 << 20, 64 << 20, true},
		{64 << 20, 64 << 20, false},
		{256 << 20, 64 << 20, true},
		{1 << 30, 64 << 20, false},
		{64 << 30, 64 << 20, true},
	} {
		p, err := planMemory(tc.ram, tc.maxValue, tc.disk)
		must.NoError(t, err)
		// The parts never exceed the budget, and the collector's limit
		// leaves room above the live blocks and in-flight values.
		must.Positive(t, p.tier)
		must.LessEq(t, tc.ram, p.tier+p.inflight)
		must.Greater(t, p.tier+p.inflight, p.goLimit)
		// The buffer pool and unauthenticated connections share the
		// headroom with garbage.
		must.Positive(t, p.unauth)
		must.LessEq(t, p.headroom/2, p.pool+p.unauth)
		if tc.ram >= 256<<20 {
			must.LessEq(t, tc.ram+tc.ram/10, p.goLimit)
			must.GreaterEq(t, min(tc.maxValue, tc.ram/2), p.inflight)
		}
	}
	_, err := planMemory(16, 64<<20, false)
	must.Error(t, err)
}
