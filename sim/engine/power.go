package engine

import "time"

// PowerModel is the simulated GPU power draw: Watts = IdleWatts + WattsPerUtil ·
// utilization, utilization being the busy fraction (what nvidia-smi reports as GPU
// utilization). Defaults: an H100 SXM idles near 70 W and peaks at its 700 W limit.
type PowerModel struct {
	IdleWatts    float64
	WattsPerUtil float64
}

// DefaultPower returns the H100 SXM model described on PowerModel.
func DefaultPower() PowerModel { return PowerModel{IdleWatts: 70, WattsPerUtil: 630} }

// Watts is the draw at utilization u (clamped to 0..1).
func (p PowerModel) Watts(u float64) float64 {
	return p.IdleWatts + p.WattsPerUtil*min(max(u, 0), 1)
}

// busyBuckets × busyBucket is the utilization window.
const (
	busyBuckets = 10
	busyBucket  = 100 * time.Millisecond
)

// BusyTracker measures the busy fraction of the last second on any clock: the caller
// passes times as durations since its own epoch, so a virtual clock works as well as
// the wall clock. Not safe for concurrent use.
type BusyTracker struct {
	busy  [busyBuckets]time.Duration
	epoch [busyBuckets]int64 // which bucket period each slot holds
}

// Add records that the engine was busy for d starting at start.
func (b *BusyTracker) Add(start, d time.Duration) {
	for d > 0 {
		k := int64(start / busyBucket)
		room := time.Duration(k+1)*busyBucket - start
		part := min(room, d)
		slot := int(k % busyBuckets)
		if b.epoch[slot] != k {
			b.epoch[slot], b.busy[slot] = k, 0
		}
		b.busy[slot] += part
		start += part
		d -= part
	}
}

// Utilization is the busy fraction of the window ending at now.
func (b *BusyTracker) Utilization(now time.Duration) float64 {
	cur := int64(now / busyBucket)
	var total time.Duration
	for slot := range busyBuckets {
		if k := b.epoch[slot]; k <= cur && k > cur-busyBuckets {
			total += b.busy[slot]
		}
	}
	// The window spans the current partial bucket and the nine before it.
	window := time.Duration(busyBuckets-1)*busyBucket + (now - time.Duration(cur)*busyBucket)
	if window <= 0 {
		return 0
	}
	return min(float64(total)/float64(window), 1)
}
