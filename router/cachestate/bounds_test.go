package cachestate

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// A registration decides what it advertises in oasis_kv_capacity; the
// router's record of it keeps at most MaxWorkerBlocks blocks whatever the
// tiers say, and counts the clamp once per registration.
func TestAdvertisedCapacityClamped(t *testing.T) {
	m := metrics.New(prometheus.NewRegistry())
	s := New(Config{MaxWorkerBlocks: 64, Metrics: m})
	defer s.Close()
	huge := prefixindex.Capacity{GPU: prefixindex.MaxTierBlocks, CPU: prefixindex.MaxTierBlocks, Disk: prefixindex.MaxTierBlocks}
	engines := []Engine{
		{ID: "huge", Model: "m", Address: "127.0.0.1:1", BlockSize: bs, KVCapacity: huge},
		{ID: "small", Model: "m", Address: "127.0.0.1:2", BlockSize: bs, KVCapacity: prefixindex.Capacity{GPU: 8, CPU: 16}},
	}
	s.Sync(context.Background(), engines)
	s.Sync(context.Background(), engines) // unchanged: not counted again
	must.Eq(t, 1.0, promtest.ToFloat64(m.KVCapacityClamped))

	k, err := s.Keys(nil, "m", bs, toks(1, 200*bs))
	must.NoError(t, err)
	s.Record("huge", k)
	s.Record("small", k)
	must.Eq(t, 64, s.ApproxIndex().WorkerEntries("huge"))
	must.Eq(t, 16, s.ApproxIndex().WorkerEntries("small"))
	// The most recent blocks are the ones kept: the tail of the prompt.
	must.Eq(t, prefixindex.TierGPU, s.ApproxIndex().Holds("huge", k[len(k)-1]))
	must.Eq(t, prefixindex.Tier(0), s.ApproxIndex().Holds("huge", k[len(k)-65]))
}

// Many engines, each within its own bound, cannot make an index hold more
// than MaxIndexBlocks entries together: the least recently stored go first,
// whichever engine stored them, and each eviction is counted.
func TestIndexBudgetAcrossEngines(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	m := metrics.New(prometheus.NewRegistry())
	s := New(Config{MaxIndexBlocks: 100, Metrics: m, Now: clock.Now})
	defer s.Close()
	var engines []Engine
	for i := range 3 {
		engines = append(engines, Engine{ID: fmt.Sprint("e", i), Model: "m", Address: fmt.Sprintf("127.0.0.1:%d", i+1),
			BlockSize: bs, KVCapacity: prefixindex.Capacity{GPU: 1000}})
	}
	s.Sync(context.Background(), engines)
	var prompts [][]uint64
	for i, e := range engines {
		k, err := s.Keys(nil, "m", bs, toks(1000*i, 80*bs))
		must.NoError(t, err)
		prompts = append(prompts, k)
		clock.Add(time.Second)
		s.Record(e.ID, k)
	}
	must.Eq(t, 100, s.ApproxIndex().Stats().Entries)
	must.Eq(t, 140.0, promtest.ToFloat64(m.IndexBudgetEvictions.WithLabelValues("approx")))
	// The last prompt is whole; the second keeps its newest 20 blocks (a
	// suffix: no prefix of it matches); the first is gone.
	must.Eq(t, 80, matchBlocks(s, prompts[2], "e2"))
	must.Eq(t, 20, s.ApproxIndex().WorkerEntries("e1"))
	must.Eq(t, 0, matchBlocks(s, prompts[1], "e1"))
	must.Eq(t, 0, s.ApproxIndex().WorkerEntries("e0"))
}
