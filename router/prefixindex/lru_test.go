package prefixindex

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shoenig/test/must"
)

func TestTieredWorkerSpills(t *testing.T) {
	ix := New(Config{})
	// Zones of 2 (GPU), 2 (CPU only), 1 (disk only).
	must.NoError(t, ix.AddTieredWorker("a", Capacity{GPU: 2, CPU: 4, Disk: 5}))
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1, 2, 3, 4, 5}, 0))
	// Most recent last: 5, 4 GPU; 3, 2 CPU; 1 disk.
	want := map[uint64]Tier{5: TierGPU, 4: TierGPU, 3: TierCPU, 2: TierCPU, 1: TierDisk}
	for d, tier := range want {
		must.Eq(t, tier, ix.Holds("a", d), must.Sprintf("digest %d", d))
	}
	m := ix.Match([]uint64{1, 2, 3}, DefaultTierWeights(), nil)
	must.SliceLen(t, 1, m)
	must.Eq(t, 3, m[0].Blocks)
	must.Eq(t, 0, m[0].GPUBlocks)
	must.Eq(t, 0.25+0.75+0.75, m[0].Weighted)

	// Storing 1 again brings it back to GPU, which pushes 4 to CPU and 2 to
	// disk; 1 left the disk zone, so nothing is dropped.
	must.NoError(t, ix.Store("a", TierGPU, []uint64{1}, 1))
	want = map[uint64]Tier{1: TierGPU, 5: TierGPU, 4: TierCPU, 3: TierCPU, 2: TierDisk}
	for d, tier := range want {
		must.Eq(t, tier, ix.Holds("a", d), must.Sprintf("digest %d", d))
	}
	// A sixth block drops the least recent (2).
	must.NoError(t, ix.Store("a", TierGPU, []uint64{6}, 2))
	must.Eq(t, 0, ix.Holds("a", 2))
	must.Eq(t, 5, ix.WorkerEntries("a"))

	// Lower tiers only come from spilling.
	must.Error(t, ix.Store("a", TierCPU, []uint64{7}, 3))
	// A smaller GPU tier spills at once; a tiered worker turned untiered forgets.
	must.NoError(t, ix.AddTieredWorker("a", Capacity{GPU: 1, CPU: 4, Disk: 5}))
	must.Eq(t, TierGPU, ix.Holds("a", 6))
	must.Eq(t, TierCPU, ix.Holds("a", 1))
	// Zones of 5, 0, 1: the three CPU entries (1, 5, 4) pass to disk, which
	// keeps the most recent, although the total would fit.
	must.NoError(t, ix.AddTieredWorker("a", Capacity{GPU: 5, CPU: 5, Disk: 6}))
	must.Eq(t, 2, ix.WorkerEntries("a"))
	must.Eq(t, TierGPU, ix.Holds("a", 6))
	must.Eq(t, TierDisk, ix.Holds("a", 1))
	must.Eq(t, 0, ix.Holds("a", 5))
	must.NoError(t, ix.AddWorker("a", 10))
	must.Eq(t, 0, ix.WorkerEntries("a"))
}

func TestTieredCapacityZones(t *testing.T) {
	for _, tc := range []struct {
		c    Capacity
		want [numZones]int
	}{
		{Capacity{GPU: 10}, [numZones]int{10, 0, 0}},
		{Capacity{GPU: 10, CPU: 40}, [numZones]int{10, 30, 0}},
		{Capacity{GPU: 10, CPU: 40, Disk: 100}, [numZones]int{10, 30, 60}},
		{Capacity{GPU: 10, Disk: 100}, [numZones]int{10, 0, 90}},
		{Capacity{GPU: 10, CPU: 5, Disk: 8}, [numZones]int{10, 0, 0}},
	} {
		must.Eq(t, tc.want, tc.c.zones(), must.Sprintf("%+v", tc.c))
	}
}

func TestTieredCapacityValidate(t *testing.T) {
	ix := New(Config{})
	for _, c := range []Capacity{
		{},
		{GPU: -1},
		{GPU: 1, CPU: -1},
		{GPU: 1, Disk: -1},
		{GPU: MaxTierBlocks + 1},
		{GPU: 1, Disk: MaxTierBlocks + 1},
	} {
		must.Error(t, ix.AddTieredWorker("a", c), must.Sprintf("%+v", c))
	}
	must.Eq(t, 0, ix.Stats().Workers)
	must.NoError(t, ix.AddTieredWorker("a", Capacity{GPU: 1}))
}

// tieredModel is a tiered worker as three plain lists, most recent first.
type tieredModel struct {
	caps   [numZones]int
	zones  [numZones][]uint64
	stamps map[uint64]int64
}

func (m *tieredModel) find(d uint64) (int, int) {
	for z := range m.zones {
		if k := slices.Index(m.zones[z], d); k >= 0 {
			return z, k
		}
	}
	return -1, -1
}

func (m *tieredModel) tier(d uint64) Tier {
	if z, _ := m.find(d); z >= 0 {
		return zoneTiers[z]
	}
	return 0
}

func (m *tieredModel) drop(z, k int) {
	delete(m.stamps, m.zones[z][k])
	m.zones[z] = slices.Delete(m.zones[z], k, k+1)
}

func (m *tieredModel) dropOldest() {
	for z := numZones - 1; z >= 0; z-- {
		if n := len(m.zones[z]); n > 0 {
			m.drop(z, n-1)
			return
		}
	}
}

func (m *tieredModel) count() int { return len(m.zones[0]) + len(m.zones[1]) + len(m.zones[2]) }

func (m *tieredModel) store(d uint64, now int64) {
	if z, k := m.find(d); z >= 0 {
		m.zones[z] = slices.Delete(m.zones[z], k, k+1)
	} else if m.count() >= m.caps[0]+m.caps[1]+m.caps[2] {
		m.dropOldest()
	}
	m.zones[0] = slices.Insert(m.zones[0], 0, d)
	m.stamps[d] = now
	m.cascade()
}

// resize is AddTieredWorker on a known worker: evict the oldest down to the
// new total, spill down, and drop what the last zone cannot hold.
func (m *tieredModel) resize(caps [numZones]int) {
	m.caps = caps
	for m.count() > caps[0]+caps[1]+caps[2] {
		m.dropOldest()
	}
	m.cascade()
	last := numZones - 1
	for len(m.zones[last]) > caps[last] {
		m.drop(last, len(m.zones[last])-1)
	}
}

func (m *tieredModel) cascade() {
	for z := 0; z < numZones-1; z++ {
		for len(m.zones[z]) > m.caps[z] {
			last := m.zones[z][len(m.zones[z])-1]
			m.zones[z] = m.zones[z][:len(m.zones[z])-1]
			m.zones[z+1] = slices.Insert(m.zones[z+1], 0, last)
		}
	}
}

func (m *tieredModel) expire(now, ttl int64) {
	for {
		var oldest uint64
		found := false
		for z := numZones - 1; z >= 0 && !found; z-- {
			if n := len(m.zones[z]); n > 0 {
				oldest, found = m.zones[z][n-1], true
			}
		}
		if !found || now-m.stamps[oldest] <= ttl {
			return
		}
		m.dropOldest()
	}
}

// TestTieredAgainstModel drives tiered workers (beside an untiered one that
// shares their digests) with random stores, removals, expiry and clears and
// compares tiers, matches and counts with three plain lists per worker.
func TestTieredAgainstModel(t *testing.T) {
	const ms, ttl = int64(1e6), int64(400)
	rng := rand.New(rand.NewPCG(3, 4))
	ix := New(Config{TTL: ttl * ms})
	names := []string{"t0", "t1", "t2", "t3", "t4"}
	models := map[string]*tieredModel{}
	for i, w := range names {
		c := Capacity{GPU: 1 + i*3, CPU: i * 5 % 7, Disk: 4 * i}
		must.NoError(t, ix.AddTieredWorker(w, c))
		models[w] = &tieredModel{caps: c.zones(), stamps: map[uint64]int64{}}
	}
	must.NoError(t, ix.AddWorker("plain", 0))
	weights := TierWeights{GPU: 1, CPU: 0.5, Disk: 0.25, Peer: 0.125}
	const keys = 40
	for step := int64(1); step <= 40000; step++ {
		w := names[rng.IntN(len(names))]
		m := models[w]
		switch r := rng.IntN(100); {
		case r < 60:
			batch := make([]uint64, 1+rng.IntN(4))
			for i := range batch {
				batch[i] = uint64(rng.IntN(keys))
			}
			must.NoError(t, ix.Store(w, TierGPU, batch, step*ms))
			for _, d := range batch {
				m.store(d, step)
			}
			m.expire(step, ttl)
			must.NoError(t, ix.Store("plain", TierCPU, batch[:1], step*ms))
		case r < 70:
			d, tier := uint64(rng.IntN(keys)), Tier(1<<rng.IntN(numTiers))
			left := make([]Tier, 1)
			must.NoError(t, ix.Remove(w, tier, []uint64{d}, left))
			if z, k := m.find(d); z >= 0 && zoneTiers[z]&tier != 0 {
				m.drop(z, k)
			}
			must.Eq(t, m.tier(d), left[0], must.Sprintf("step %d", step))
		case r < 71:
			_, err := ix.ClearWorker(w)
			must.NoError(t, err)
			m.zones, m.stamps = [numZones][]uint64{}, map[uint64]int64{}
		case r < 72:
			c := Capacity{GPU: 1 + rng.IntN(8), CPU: rng.IntN(16), Disk: rng.IntN(24)}
			must.NoError(t, ix.AddTieredWorker(w, c))
			m.resize(c.zones())
		case r < 74:
			ix.Expire(step * ms)
			for _, mm := range models {
				mm.expire(step, ttl)
			}
		default:
			req := make([]uint64, 1+rng.IntN(5))
			for i := range req {
				req[i] = uint64(rng.IntN(keys))
			}
			got := matchesByWorker(ix.Match(req, weights, nil))
			for _, name := range names {
				checkTieredMatch(t, step, name, models[name], req, weights, got[name])
			}
		}
	}
	for _, name := range names {
		m := models[name]
		must.Eq(t, m.count(), ix.WorkerEntries(name))
		for d := uint64(0); d < keys; d++ {
			must.Eq(t, m.tier(d), ix.Holds(name, d))
		}
	}
}

func checkTieredMatch(t *testing.T, step int64, name string, m *tieredModel, req []uint64, weights TierWeights, got Match) {
	t.Helper()
	wt := weights.table()
	blocks, gpu, weighted := 0, 0, 0.0
	for _, d := range req {
		tier := m.tier(d)
		if tier == 0 {
			break
		}
		blocks++
		weighted += float64(wt[tier])
		if tier == TierGPU {
			gpu++
		}
	}
	must.Eq(t, blocks, got.Blocks, must.Sprintf("step %d worker %s req %v", step, name, req))
	must.Eq(t, gpu, got.GPUBlocks, must.Sprintf("step %d worker %s req %v", step, name, req))
	must.True(t, math.Abs(weighted-got.Weighted) < 1e-5, must.Sprintf("step %d worker %s weighted %v vs %v", step, name, weighted, got.Weighted))
}
