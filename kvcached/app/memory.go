package app

import (
	"github.com/oasis-llm/oasis/kvcached/store"
)

// MemoryPlan splits --ram-bytes, the process's memory budget, so RSS stays
// within it + 10% at any tier size:
//
//   - Inflight: values being received (parsed, not yet stored) and peer
//     fetch/serve buffers share one budget of 1/8 of the total (at most
//     1 GiB), but at least one maximal value (a value larger than the budget
//     is let through alone), and at most half;
//   - Headroom: 1/16 (at most 1 GiB) for garbage between GC cycles, a
//     quarter of it (Pool) for buffers of released values kept for reuse
//     (the store's buffer pool, which turns that garbage into reuse) and a
//     quarter (Unauth) for connections that have not authenticated, their
//     buffers and arguments together (server.Config.UnauthenticatedBytes);
//   - Tier: the rest holds blocks (the RAM tier's limit, INFO's maxmemory);
//   - GoLimit: the Go runtime's memory limit is the total + 10% minus what
//     the runtime does not manage (the binary's mapped text and data, and
//     Pebble's cgo-allocated cache and memtables with a disk tier), and at
//     least what the tier, the budget and some slack need, so the collector
//     never chases a limit the live heap already exceeds.
type MemoryPlan struct {
	Tier, Inflight, Headroom, Pool, Unauth, GoLimit int64
}

// binaryOverhead is the RSS of the binary's text, data and runtime
// structures outside the Go heap (~10-19 MiB measured), with a margin.
const binaryOverhead = 20 << 20

// PlanMemory is the plan for a budget of ram bytes, values up to maxValue
// and, with disk, a disk tier.
func PlanMemory(ram, maxValue int64, disk bool) (MemoryPlan, error) {
	inflight := min(max(min(ram/8, 1<<30), maxValue), ram/2)
	headroom := min(ram/16, 1<<30)
	tier := ram - inflight - headroom
	if tier < 64<<10 {
		return MemoryPlan{}, flagErr("--ram-bytes", "%d is too small", ram)
	}
	nonGo := int64(binaryOverhead)
	if disk {
		nonGo += store.PebbleBytes
	}
	goLimit := max(ram+ram/10-nonGo, tier+inflight+8<<20)
	return MemoryPlan{Tier: tier, Inflight: inflight, Headroom: headroom, Pool: headroom / 4, Unauth: headroom / 4, GoLimit: goLimit}, nil
}
