package cachestate

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/shoenig/test/must"
)

func TestResolveEndpoint(t *testing.T) {
	cases := []struct {
		endpoint, addr, want, err string
	}{
		{"tcp://*:5557", "10.0.0.5:8000", "tcp://10.0.0.5:5557", ""},
		{"tcp://0.0.0.0:5557", "10.0.0.5:8000", "tcp://10.0.0.5:5557", ""},
		{"tcp://10.0.0.9:5557", "10.0.0.5:8000", "tcp://10.0.0.9:5557", ""},
		{"tcp://*:5557", "[::1]:8000", "tcp://[::1]:5557", ""},
		{"ipc:///tmp/x", "10.0.0.5:8000", "", "want tcp://host:port"},
		{"tcp://host", "10.0.0.5:8000", "", "want tcp://host:port"},
		{"tcp://*:5557", "nohostport", "", "wildcard host"},
	}
	for _, tc := range cases {
		got, err := ResolveEndpoint(tc.endpoint, tc.addr)
		if tc.err != "" {
			must.ErrorContains(t, err, tc.err)
			continue
		}
		must.NoError(t, err)
		must.Eq(t, tc.want, got)
	}
}

func matchBlocks(s *State, keys []uint64, id string) int {
	for _, m := range s.Match(keys, prefixindex.DefaultTierWeights(), nil) {
		if m.Worker == id {
			return m.Blocks
		}
	}
	return 0
}

// publishUntil publishes batch repeatedly (a PUB socket drops messages until
// the subscriber's connection is up) until cond holds; what names cond.
func publishUntil(t *testing.T, pub *kvevents.Publisher, batch kvevents.EventBatch, what string, cond func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, what, func() bool {
		if cond() {
			return true
		}
		_, err := pub.Publish(batch)
		must.NoError(t, err)
		return false
	})
}

// TestStateOverZMQ runs the event-driven path over real ZMQ sockets: events
// reach the index, a publisher restart on the same port resynchronises the
// worker, and an engine leaving discovery takes its entries with it.
func TestStateOverZMQ(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	must.NoError(t, err)
	port := pub.Addr().(*net.TCPAddr).Port

	s := New(Config{})
	defer s.Close()
	eng := Engine{ID: "e1", Model: "model-a", Address: "127.0.0.1:1", BlockSize: bs, KVEvents: fmt.Sprintf("tcp://*:%d", port)}
	s.Sync(ctx, []Engine{eng})
	must.True(t, s.EventDriven("e1"))

	seq := toks(1, 3*bs)
	k := keys(t, "model-a", seq)
	first := kvevents.EventBatch{TS: 1, Events: []kvevents.Event{stored(nil, []kvevents.Hash{h(1), h(2), h(3)}, seq, "")}}
	publishUntil(t, pub, first, "the first batch", func() bool { return matchBlocks(s, k, "e1") == 3 })

	// Restart: a new publisher on the same port counts from seq 0 again.
	must.NoError(t, pub.Close())
	var pub2 *kvevents.Publisher
	testutil.EventuallyEvery(t, 10*time.Second, 100*time.Millisecond, fmt.Sprintf("port %d bound again", port), func() bool {
		pub2, err = kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: fmt.Sprintf("tcp://127.0.0.1:%d", port)})
		return err == nil
	})
	defer pub2.Close()
	fresh := toks(500, bs)
	kf := keys(t, "model-a", fresh)
	second := kvevents.EventBatch{TS: 2, Events: []kvevents.Event{stored(nil, []kvevents.Hash{h(9)}, fresh, "")}}
	publishUntil(t, pub2, second, "the second batch", func() bool { return matchBlocks(s, kf, "e1") == 1 })
	must.Eq(t, 0, matchBlocks(s, k, "e1"))
	st, ok := s.EngineStats("e1")
	must.True(t, ok)
	must.Positive(t, st.Resyncs)

	// The engine leaves: subscriber stopped, entries dropped.
	s.Sync(ctx, nil)
	must.Eq(t, 0, matchBlocks(s, kf, "e1"))
	must.SliceEmpty(t, s.Engines())
	must.Eq(t, 0, s.EventIndex().Stats().Entries)
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

func TestApproximateLearning(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := New(Config{ApproxCapacity: 4, ApproxTTL: time.Minute, InflightTTL: -1, Now: clock.Now})
	defer s.Close()
	ctx := context.Background()
	s.Sync(ctx, []Engine{
		{ID: "llama", Model: "m", Address: "127.0.0.1:1", BlockSize: bs},
		{ID: "vllm", Model: "m", Address: "127.0.0.1:2", BlockSize: bs, KVEvents: "tcp://127.0.0.1:1"},
	})
	must.False(t, s.EventDriven("llama"))
	must.True(t, s.EventDriven("vllm"))
	k, err := s.Keys(nil, "m", bs, toks(1, 3*bs))
	must.NoError(t, err)
	s.Record("llama", k)
	s.Record("vllm", k) // ignored: its events are the truth (in-flight record off)
	must.Eq(t, 3, matchBlocks(s, k, "llama"))
	must.Eq(t, 0, matchBlocks(s, k, "vllm"))

	// Capacity model: 4 blocks; a second 3-block prompt evicts the oldest two.
	k2, err := s.Keys(nil, "m", bs, toks(100, 3*bs))
	must.NoError(t, err)
	clock.Add(time.Second)
	s.Record("llama", k2)
	must.Eq(t, 3, matchBlocks(s, k2, "llama"))
	must.Eq(t, 0, matchBlocks(s, k, "llama")) // block 0 of k was evicted first

	// TTL: a minute later without a new decision it is forgotten.
	clock.Add(2 * time.Minute)
	s.Record("llama", k[:1])
	must.Eq(t, 0, matchBlocks(s, k2, "llama"))
	must.Eq(t, 1, matchBlocks(s, k, "llama"))
}

// The replay path over real ZMQ sockets: batches fetched from a publisher's
// replay endpoint fill a gap without a resync.
func TestReplayOverZMQ(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0"})
	must.NoError(t, err)
	defer pub.Close()
	go pub.Run(ctx)
	seq := toks(1, 3*bs)
	batches := []kvevents.EventBatch{
		{Events: []kvevents.Event{stored(nil, []kvevents.Hash{h(1)}, seq[:bs], "")}},
		{Events: []kvevents.Event{stored(hp(1), []kvevents.Hash{h(2)}, seq[bs:2*bs], "")}},
		{Events: []kvevents.Event{stored(hp(2), []kvevents.Hash{h(3)}, seq[2*bs:], "")}},
	}
	for _, b := range batches {
		_, err := pub.Publish(b)
		must.NoError(t, err)
	}
	replay := "tcp://" + pub.ReplayAddr().String()
	fetch := func(from int64) ([]kvevents.Message, error) {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return kvevents.Replay(rctx, replay, "", from)
	}
	f := newFixture(t)
	must.NoError(t, f.ew.Apply(kvevents.Message{Seq: 0, Batch: batches[0]}, 0))
	must.NoError(t, f.ew.ApplyOrReplay(kvevents.Message{Seq: 2, Missed: 1, Batch: batches[2]}, 0, fetch))
	n, _ := f.matched(t, seq)
	must.Eq(t, 3, n)
	must.Eq(t, int64(0), f.ew.Stats().Resyncs)
	must.Eq(t, int64(1), f.ew.Stats().Replays)
}

// An event-less engine that advertises its tiers is modelled with them: what
// falls out of its GPU tier is still credited, at the CPU and disk weights.
func TestApproximateLearningAdvertisedTiers(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1000, 0)}
	s := New(Config{ApproxCapacity: 4, ApproxTTL: time.Minute, InflightTTL: -1, Now: clock.Now})
	defer s.Close()
	s.Sync(context.Background(), []Engine{
		{ID: "tiered", Model: "m", Address: "127.0.0.1:1", BlockSize: bs, KVCapacity: prefixindex.Capacity{GPU: 2, CPU: 4, Disk: 6}},
		{ID: "bad", Model: "m", Address: "127.0.0.1:2", BlockSize: bs, KVCapacity: prefixindex.Capacity{GPU: 2, CPU: -1}},
	})
	k, err := s.Keys(nil, "m", bs, toks(1, 6*bs))
	must.NoError(t, err)
	s.Record("tiered", k)
	s.Record("bad", k) // refused capacity: the default model, 4 GPU blocks
	w := prefixindex.DefaultTierWeights()
	got := map[string]prefixindex.Match{}
	for _, m := range s.Match(k, w, nil) {
		got[m.Worker] = m
	}
	// Blocks 0-1 disk only, 2-3 CPU, 4-5 GPU: the whole prompt is held.
	must.Eq(t, 6, got["tiered"].Blocks)
	must.Eq(t, 2, got["tiered"].GPUBlocks)
	must.Eq(t, 2*w.Disk+2*w.CPU+2*w.GPU, got["tiered"].Weighted)
	// The default model evicted blocks 0-1, so no prefix is left.
	must.Eq(t, 0, got["bad"].Blocks)
}
