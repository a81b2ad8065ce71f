package main

import (
	"fmt"

	"github.com/oasis-llm/oasis/kvcached/store"
)

// memoryPlan splits --ram-bytes, the process's memory budget, so RSS stays
// within it + 10% at any tier size:
//
//   - inflight: values being received (parsed, not yet stored) and peer
//     fetch/serve buffers share one budget of 1/8 of the total (at most
//     1 GiB), but at least one maximal value (a value larger than the budget
//     is let through alone), and at most half;
//   - headroom: 1/16 (at most 1 GiB) for garbage between GC cycles, a
//     quarter of it (pool) for buffers of released values kept for reuse
//     (the store's buffer pool, which turns that garbage into reuse) and a
//     quarter (unauth) for connections that have not authenticated, their
//     buffers and arguments together (server.Config.UnauthenticatedBytes);
//   - tier: the rest holds blocks (the RAM tier's limit, INFO's maxmemory);
//   - goLimit: the Go runtime's memory limit is the total + 10% minus what
//     the runtime does not manage (the binary's mapped text and data, and
//     Pebble's cgo-allocated cache and memtables with a disk tier), and at
//     least what the tier, the budget and some slack need, so the collector
//     never chases a limit the live heap already exceeds.
type memoryPlan struct {
	tier, inflight, headroom, pool, unauth, goLimit int64
}

// binaryOverhead is the RSS of the binary's text, data and runtime
// structures outside the Go heap (~10-19 MiB measured), with a margin.
const binaryOverhead = 20 << 20

func planMemory(ram, maxValue int64, disk bool) (memoryPlan, error) {
	inflight := min(max(min(ram/8, 1<<30), maxValue), ram/2)
	headroom := min(ram/16, 1<<30)
	tier := ram - inflight - headroom
	if tier < 64<<10 {
		return memoryPlan{}, fmt.Errorf("--ram-bytes %d is too small", ram)
	}
	nonGo := int64(binaryOverhead)
	if disk {
		nonGo += store.PebbleBytes
	}
	goLimit := max(ram+ram/10-nonGo, tier+inflight+8<<20)
	return memoryPlan{tier: tier, inflight: inflight, headroom: headroom, pool: headroom / 4, unauth: headroom / 4, goLimit: goLimit}, nil
}
