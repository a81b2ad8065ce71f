package cachestate

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/shoenig/test/must"
)

func TestInflightMatcherFolds(t *testing.T) {
	m := func(w string, blocks int, weighted float64) prefixindex.Match {
		return prefixindex.Match{Worker: w, Blocks: blocks, Weighted: weighted, GPUBlocks: blocks}
	}
	// f is m with the blocks past the confirmed match counted as in flight.
	f := func(w string, blocks int, weighted float64, inflight int) prefixindex.Match {
		r := m(w, blocks, weighted)
		r.Inflight = inflight
		return r
	}
	cases := []struct {
		name     string
		held     []prefixindex.Match // in out, from start (after one unrelated entry)
		inflight map[string]int      // worker → blocks recorded in flight
		want     []prefixindex.Match
	}{
		{"in flight only", nil, map[string]int{"a": 3}, []prefixindex.Match{f("a", 3, 3, 3)}},
		{"held only", []prefixindex.Match{m("a", 2, 2)}, nil, []prefixindex.Match{m("a", 2, 2)}},
		{"in flight longer", []prefixindex.Match{m("a", 1, 1)}, map[string]int{"a": 3}, []prefixindex.Match{f("a", 3, 3, 2)}},
		{"held longer", []prefixindex.Match{m("a", 3, 3)}, map[string]int{"a": 2}, []prefixindex.Match{m("a", 3, 3)}},
		{"held in a lower tier, in flight as long", []prefixindex.Match{m("a", 3, 1)}, map[string]int{"a": 3}, []prefixindex.Match{m("a", 3, 3)}},
		{"two workers", []prefixindex.Match{m("a", 3, 3)}, map[string]int{"a": 1, "b": 2}, []prefixindex.Match{m("a", 3, 3), f("b", 2, 2, 2)}},
	}
	keys := []uint64{11, 12, 13}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ix := NewInflightIndex(time.Minute, 16, 64, nil)
			for w, n := range tc.inflight {
				must.NoError(t, ix.AddWorker(w, 0))
				must.NoError(t, ix.Store(w, prefixindex.TierGPU, keys[:n], 0))
			}
			// An entry before start (another index's worker of the same id)
			// is not folded into.
			out := append([]prefixindex.Match{m("a", 9, 9)}, tc.held...)
			var fm InflightMatcher
			got := fm.Match(ix, keys, prefixindex.DefaultTierWeights(), out, 1)
			must.Eq(t, m("a", 9, 9), got[0])
			must.SliceContainsAll(t, tc.want, got[1:])
			must.Eq(t, out[:1], fm.Match(nil, keys, prefixindex.DefaultTierWeights(), out[:1], 1))
		})
	}
}

// TestInflightDecisionsWithEvents: a decision to an event-driven engine counts
// at once, before any event; the engine's events take over; an entry they
// never confirm is forgotten after the TTL; the per-engine and total bounds
// hold; an engine leaving takes its entries.
func TestInflightDecisionsWithEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	must.NoError(t, err)
	defer pub.Close()
	port := pub.Addr().(*net.TCPAddr).Port

	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := New(Config{InflightTTL: 5 * time.Second, InflightWorkerBlocks: 4, InflightMaxBlocks: 6, Now: clock.Now})
	defer s.Close()
	s.Sync(ctx, []Engine{
		{ID: "a", Model: "m", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: "tcp://127.0.0.1:1"}, // publishes nothing
		{ID: "b", Model: "m", Address: "127.0.0.1:2", BlockSize: bs, KVEvents: fmt.Sprintf("tcp://127.0.0.1:%d", port)},
	})
	seq := toks(1, 3*bs)
	k, err := s.Keys(nil, "m", bs, seq)
	must.NoError(t, err)

	s.Record("a", k)
	must.Eq(t, 3, matchBlocks(s, k, "a")) // before any event
	must.Eq(t, 0, matchBlocks(s, k, "b"))
	s.Forget("a", k) // a refused it: taken back
	must.Eq(t, 0, matchBlocks(s, k, "a"))
	s.Record("a", k)
	must.Eq(t, 3, matchBlocks(s, k, "a"))

	batch := kvevents.EventBatch{TS: 1, Events: []kvevents.Event{stored(nil, []kvevents.Hash{h(1), h(2), h(3)}, seq, "")}}
	publishUntil(t, pub, batch, "b's events", func() bool { return matchBlocks(s, k, "b") == 3 })
	s.Record("b", k) // confirmed already: one entry per worker in the match
	n := 0
	for _, mt := range s.Match(k, prefixindex.DefaultTierWeights(), nil) {
		if mt.Worker == "b" {
			n++
		}
	}
	must.Eq(t, 1, n)
	s.Forget("b", k) // the in-flight entry goes; what b's events say stays
	must.Eq(t, 3, matchBlocks(s, k, "b"))

	// Past the TTL the next decision sweeps: a's unconfirmed entry goes,
	// b keeps what its events say.
	clock.Add(6 * time.Second)
	other, err := s.Keys(nil, "m", bs, toks(500, bs))
	must.NoError(t, err)
	s.Record("b", other)
	must.Eq(t, 0, matchBlocks(s, k, "a"))
	must.Eq(t, 3, matchBlocks(s, k, "b"))

	// Bounds: 4 blocks per engine (a 3-block prompt after another evicts
	// the first's oldest blocks), 6 in all.
	k2, err := s.Keys(nil, "m", bs, toks(100, 3*bs))
	must.NoError(t, err)
	k3, err := s.Keys(nil, "m", bs, toks(200, 3*bs))
	must.NoError(t, err)
	s.Record("a", k2)
	s.Record("a", k3)
	must.Eq(t, 3, matchBlocks(s, k3, "a"))
	must.Eq(t, 0, matchBlocks(s, k2, "a"))
	must.Eq(t, 4, s.InflightIndex().WorkerEntries("a"))
	s.Record("b", k2)
	must.Eq(t, 6, s.InflightIndex().Stats().Entries)

	s.Sync(ctx, nil)
	must.Eq(t, 0, s.InflightIndex().Stats().Entries)
}

func TestInflightOff(t *testing.T) {
	s := New(Config{InflightTTL: -1})
	defer s.Close()
	s.Sync(context.Background(), []Engine{{ID: "a", Model: "m", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: "tcp://127.0.0.1:1"}})
	k, err := s.Keys(nil, "m", bs, toks(1, 3*bs))
	must.NoError(t, err)
	s.Record("a", k)
	must.Eq(t, 0, matchBlocks(s, k, "a"))
	must.Nil(t, s.InflightIndex())
}

// Decisions recorded while others match (go test -race); the bounds are
// above what the test stores, so nothing is evicted.
func TestInflightConcurrent(t *testing.T) {
	s := New(Config{InflightTTL: time.Minute, InflightWorkerBlocks: 256, InflightMaxBlocks: 1024})
	defer s.Close()
	var engs []Engine
	for i := range 4 {
		engs = append(engs, Engine{ID: fmt.Sprint("e", i), Model: "m", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: "tcp://127.0.0.1:1"})
	}
	s.Sync(context.Background(), engs)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			var out []prefixindex.Match
			for i := range 200 {
				k, err := s.Keys(nil, "m", bs, toks(g*1000+i%7, 4*bs))
				if err != nil {
					t.Error(err)
					return
				}
				s.Record(engs[(g+i)%4].ID, k)
				out = s.Match(k, prefixindex.DefaultTierWeights(), out[:0])
				if len(out) == 0 {
					t.Errorf("a recorded decision is not matched: g %d i %d entries %d", g, i, s.InflightIndex().Stats().Entries)
					return
				}
			}
		})
	}
	wg.Wait()
	must.LessEq(t, 4*7*4*4, s.InflightIndex().Stats().Entries) // 7 prompts of 4 blocks per goroutine, on each engine
}
