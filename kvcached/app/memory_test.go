package app

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
		p, err := PlanMemory(tc.ram, tc.maxValue, tc.disk)
		must.NoError(t, err)
		// The parts never exceed the budget, and the collector's limit
		// leaves room above the live blocks and in-flight values.
		must.Positive(t, p.Tier)
		must.LessEq(t, tc.ram, p.Tier+p.Inflight)
		must.Greater(t, p.Tier+p.Inflight, p.GoLimit)
		// The buffer pool and unauthenticated connections share the
		// headroom with garbage.
		must.Positive(t, p.Unauth)
		must.LessEq(t, p.Headroom/2, p.Pool+p.Unauth)
		if tc.ram >= 256<<20 {
			must.LessEq(t, tc.ram+tc.ram/10, p.GoLimit)
			must.GreaterEq(t, min(tc.maxValue, tc.ram/2), p.Inflight)
		}
	}
	_, err := PlanMemory(16, 64<<20, false)
	must.Error(t, err)
}
