package app

import (
	"context"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
)

// GC percent bounds for tuneGC. The floor keeps a heap of millions of small
// blocks (whose pointers the collector must mark) from being collected after
// every few MiB; the ceiling keeps the percent finite for a near-empty heap.
const (
	minGCPercent = 25
	maxGCPercent = 10000
)

// gcPercentFor returns the GC percent that puts the heap goal at the live
// heap plus headroom.
func gcPercentFor(live, headroom int64) int {
	if live <= 0 {
		return maxGCPercent
	}
	p := headroom * 100 / live
	return int(min(max(p, minGCPercent), maxGCPercent))
}

// tuneGC re-sets the GC percent after every collection so the heap goal is
// the live heap plus the memory plan's headroom, until ctx ends. A fixed
// percent grows the heap by a multiple of what is live: with a GiB of 1 MiB
// blocks stored, GC percent 400 let the heap grow by 3 GiB of fresh pages
// before collecting, and the kernel's page faults for them (zeroing each
// page, charging it to the cgroup) cost about a third of kvcached's CPU per
// 1 MiB SET; with the goal at live + headroom the collector hands the
// garbage back for reuse after a bounded amount of allocation. A near-empty
// heap, on the other hand, gets a large percent, so a hot key rewritten in
// a loop does not start a collection every few MiB.
func tuneGC(ctx context.Context, headroom int64) {
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	last := 400
	debug.SetGCPercent(last)
	var arm func()
	arm = func() {
		// A pointerful object, so it is not one of the tiny allocations
		// whose finalizers may never run.
		s := &struct{ p *int }{}
		runtime.SetFinalizer(s, func(*struct{ p *int }) {
			if ctx.Err() != nil {
				return
			}
			metrics.Read(sample)
			if sample[0].Value.Kind() == metrics.KindUint64 {
				p := gcPercentFor(int64(sample[0].Value.Uint64()), headroom)
				// Only a real change: setting the percent recomputes the
				// collector's pacing.
				if p < last*7/8 || p > last*9/8 {
					debug.SetGCPercent(p)
					last = p
				}
			}
			arm()
		})
	}
	arm()
}
