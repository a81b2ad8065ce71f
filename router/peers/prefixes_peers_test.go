package peers

import (
	"context"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// Two routers, one engine without KV events: a prompt router A sent the
// engine is found in router B's approximate record of it, through the
// gossip (Routed at A, OnPrefixes into B's cachestate), and a prompt B
// never learnt of is not.
func TestPrefixRecordsReachPeers(t *testing.T) {
	c, _ := testutil.StartConsul(t)
	key := []byte("0123456789abcdef0123456789abcdef")
	const engine = "llama-1"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var states [2]*cachestate.State
	var ns [2]*node
	for i := range states {
		s := cachestate.New(cachestate.Config{})
		t.Cleanup(func() { must.NoError(t, s.Close()) })
		s.Sync(ctx, []cachestate.Engine{{ID: engine, Model: "m", Address: "127.0.0.1:1", BlockSize: 16}})
		must.False(t, s.EventDriven(engine))
		states[i] = s
		ns[i] = startNode(t, c, []string{"oasis-router-a", "oasis-router-b"}[i], key, func(cfg *Config) { cfg.OnPrefixes = s.Record })
	}
	testutil.Eventually(t, 15*time.Second, "two routers gossiping", func() bool {
		return ns[0].gossiping() == 2 && ns[1].gossiping() == 2
	})
	tokens := make([]uint32, 200) // 12 full blocks and a partial one
	for i := range tokens {
		tokens[i] = uint32(i * 7)
	}
	keys, err := states[0].Keys(nil, "m", 16, tokens)
	must.NoError(t, err)
	must.Positive(t, len(keys))
	other, err := states[0].Keys(nil, "m", 16, tokens[100:])
	must.NoError(t, err)

	states[0].Record(engine, keys) // what router A's gateway does on a 2xx
	ns[0].Routed(engine, keys)
	blocks := func(s *cachestate.State, keys []uint64) int {
		for _, m := range s.Match(keys, prefixindex.DefaultTierWeights(), nil) {
			if m.Worker == engine {
				return m.Blocks
			}
		}
		return 0
	}
	testutil.Eventually(t, 10*time.Second, "router B finds the prefix router A routed", func() bool {
		return blocks(states[1], keys) == len(keys)
	})
	must.Eq(t, 0, blocks(states[1], other))
}
