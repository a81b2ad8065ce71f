package cachestate

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// kvcachedProc is a real oasis-kvcached process with presence events on.
type kvcachedProc struct {
	addr           string
	events, replay string
	client         *redis.Client
}

func startKVCached(t *testing.T, bin string) *kvcachedProc {
	t.Helper()
	p := &kvcachedProc{
		addr:   testutil.FreeAddr(t),
		events: "tcp://" + testutil.FreeAddr(t),
		replay: "tcp://" + testutil.FreeAddr(t),
	}
	testutil.Start(t, exec.Command(bin, "--addr", p.addr, "--http-addr", "", "--ram-bytes", "64MiB",
		"--disk-bytes", "64MiB", "--data-dir", t.TempDir(),
		"--kv-events-endpoint", p.events, "--kv-events-replay-endpoint", p.replay,
		"--kv-events-block-size", "16", "--log-level", "warn"))
	p.client = redis.NewClient(&redis.Options{Addr: p.addr, MaxRetries: -1})
	t.Cleanup(func() { p.client.Close() })
	testutil.Eventually(t, 10*time.Second, "oasis-kvcached to answer PING", func() bool {
		return p.client.Ping(context.Background()).Err() == nil
	})
	return p
}

// TestPresenceFromRealKVCached runs two real oasis-kvcached processes (nodes
// A and B) and writes blocks into them with a real Redis client, in both key
// conventions kvcached announces: the Oasis-native key carrying a blockdigest
// digest, and LMCache's key carrying a chunk hash equal to the engine's block
// hash. The router's index marks each block CPU (and disk after the spill)
// for the engine on the same node and peer for the engine on the other node,
// and withdraws the marks when the key is deleted or the kvcached leaves.
func TestPresenceFromRealKVCached(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs oasis-kvcached")
	}
	bin := testutil.BuildCommand(t, "github.com/oasis-llm/oasis/cmd/oasis-kvcached")
	kcA, kcB := startKVCached(t, bin), startKVCached(t, bin)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The engines' own KV events (vLLM schema); only their hash maps matter here.
	engA, engB := newPub(t, ctx, false), newPub(t, ctx, false)
	const model, blockSize = "llama", 16
	s := New(Config{})
	defer s.Close()
	s.Sync(ctx, []Engine{
		{ID: "a1", Model: model, Address: "127.0.0.1:1", BlockSize: blockSize, KVEvents: endpointOf(engA.Addr()), Node: "node-a"},
		{ID: "b1", Model: model, Address: "127.0.0.1:1", BlockSize: blockSize, KVEvents: endpointOf(engB.Addr()), Node: "node-b"},
	})
	s.SyncKVCaches(ctx, []KVCache{
		{ID: "kc-a", Address: kcA.addr, Node: "node-a", KVEvents: kcA.events, KVEventsReplay: kcA.replay},
		{ID: "kc-b", Address: kcB.addr, Node: "node-b", KVEvents: kcB.events, KVEventsReplay: kcB.replay},
	})
	ix := s.EventIndex()
	value := make([]byte, 64<<10)

	// Oasis-native keys: the digests of a 3-block prompt, written to kc-a.
	prompt := make([]uint32, 3*blockSize)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	keys, err := s.Keys(nil, model, blockSize, prompt)
	must.NoError(t, err)
	hs, err := blockdigest.New(blockdigest.Domain{Model: model}, blockSize)
	must.NoError(t, err)
	digests := hs.Digests(prompt)
	for _, d := range digests {
		must.NoError(t, kcA.client.Set(ctx, "oasis@"+model+"@"+d.String(), value, 0).Err())
	}
	testutil.Eventually(t, 10*time.Second, "native keys marked", func() bool {
		for _, k := range keys {
			if ix.Holds("a1", k)&prefixindex.TierCPU == 0 || ix.Holds("b1", k) != prefixindex.TierPeer {
				return false
			}
		}
		return true
	})
	// The spill to SSD adds the disk tier on node A.
	testutil.Eventually(t, 10*time.Second, "spill to disk marked", func() bool { return ix.Holds("a1", keys[0])&prefixindex.TierDisk != 0 })
	// The router's match counts the prompt as held by both, in lower tiers.
	for _, m := range s.Match(keys, prefixindex.DefaultTierWeights(), nil) {
		must.Eq(t, 3, m.Blocks, must.Sprintf("worker %s", m.Worker))
	}

	// LMCache keys: a1's engine stores a block under vLLM hash H (its event),
	// LMCache writes the chunk with chunk hash H to kc-b.
	tokens := make([]int32, blockSize)
	for i := range tokens {
		tokens[i] = int32(7000 + i)
	}
	u := make([]uint32, blockSize)
	for i, tk := range tokens {
		u[i] = uint32(tk)
	}
	lk, err := s.Keys(nil, model, blockSize, u)
	must.NoError(t, err)
	const vllmHash = uint64(0x5eed0000c0ffee01)
	stored := kvevents.EventBatch{TS: 1, Events: []kvevents.Event{kvevents.BlockStored{
		BlockHashes: []kvevents.Hash{kvevents.HashUint64(vllmHash)}, TokenIDs: tokens, BlockSize: blockSize}}}
	publishUntil(t, engA, stored, "the engine event indexed", func() bool { return ix.Holds("a1", lk[0]) == prefixindex.TierGPU })
	lmKey := fmt.Sprintf("%s@1@0@%x@bfloat16", model, vllmHash)
	must.NoError(t, kcB.client.Set(ctx, lmKey+"kv_bytes", value, 0).Err())
	must.NoError(t, kcB.client.Set(ctx, lmKey+"metadata", []byte("meta"), 0).Err())
	testutil.Eventually(t, 10*time.Second, "LMCache chunk marked", func() bool {
		return ix.Holds("b1", lk[0])&prefixindex.TierCPU != 0 && ix.Holds("a1", lk[0]) == prefixindex.TierGPU|prefixindex.TierPeer
	})

	// Deleting the native keys withdraws their marks everywhere.
	for _, d := range digests {
		must.NoError(t, kcA.client.Del(ctx, "oasis@"+model+"@"+d.String()).Err())
	}
	testutil.Eventually(t, 10*time.Second, "native marks withdrawn", func() bool {
		return ix.Holds("a1", keys[0]) == 0 && ix.Holds("b1", keys[0]) == 0
	})

	// kc-b leaves discovery: its chunk is no longer reachable from anyone.
	s.SyncKVCaches(ctx, []KVCache{{ID: "kc-a", Address: kcA.addr, Node: "node-a", KVEvents: kcA.events, KVEventsReplay: kcA.replay}})
	must.Eq(t, prefixindex.Tier(0), ix.Holds("b1", lk[0]))
	must.Eq(t, prefixindex.TierGPU, ix.Holds("a1", lk[0]))
	st, ok := s.KVCacheStats("kc-a")
	must.True(t, ok)
	must.Eq(t, int64(0), st.Unresolved)
}
