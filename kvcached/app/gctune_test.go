package app

import (
	"context"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
)

func TestGCPercentFor(t *testing.T) {
	// The goal is live + headroom: 1 GiB live with 256 MiB of headroom
	// collects after 256 MiB of new garbage, not after 4 GiB (percent 400).
	must.Eq(t, 25, gcPercentFor(1<<30, 256<<20))
	must.Eq(t, 50, gcPercentFor(512<<20, 256<<20))
	must.Eq(t, 2000, gcPercentFor(16<<20, 320<<20))
	// Bounded both ways.
	must.Eq(t, minGCPercent, gcPercentFor(60<<30, 1<<30))
	must.Eq(t, maxGCPercent, gcPercentFor(1, 1<<30))
	must.Eq(t, maxGCPercent, gcPercentFor(0, 1<<30))
}

func TestTuneGCFollowsTheLiveHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const headroom = 8 << 20
	tuneGC(ctx, headroom)
	// 64 MiB live (plus the test binary's) with 8 MiB of headroom: held at
	// or near the floor (changes within 1/8 are not applied).
	live := make([][]byte, 64)
	for i := range live {
		live[i] = make([]byte, 1<<20)
	}
	got := 0
	// The tuner's finalizer runs after a cycle: collect until it has acted.
	testutil.EventuallyEvery(t, 10*time.Second, 10*time.Millisecond, "the tuner to lower GOGC under 50", func() bool {
		runtime.GC()
		got = debug.SetGCPercent(100) // read it, then put it back
		debug.SetGCPercent(got)
		return got < 50
	})
	runtime.KeepAlive(live)
	// Without the tuner it stays at 400 (a heap goal of 5× the live heap).
	must.Between(t, minGCPercent, got, 49)
}
