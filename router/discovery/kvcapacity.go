package discovery

import (
	"strconv"
	"strings"

	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/worker"
)

// MetaKVCapacity is an engine's KV cache per tier, in tokens, as configured:
// "gpu=524288,cpu=4194304,disk=33554432" (cpu and disk optional; the tiers
// are written through, so each holds the faster tiers' blocks too, as with
// LMCache, vLLM's offloading connector and SGLang's HiCache). The router uses
// it only for engines without KV events, as the size of the cache its record
// of its own routing decisions models (router/cachestate).
const MetaKVCapacity = "oasis_kv_capacity"

// maxKVCapacityTokens bounds each tier: far above any engine's cache.
const maxKVCapacityTokens = 1 << 36

// kvCapacityOf parses w's oasis_kv_capacity into blocks of w's block size.
// An empty value is the zero Capacity (unknown).
func kvCapacityOf(w *worker.Worker, get func(string) string) (prefixindex.Capacity, error) {
	v := get(MetaKVCapacity)
	if v == "" {
		return prefixindex.Capacity{}, nil
	}
	bad := func(reason string) (prefixindex.Capacity, error) {
		return prefixindex.Capacity{}, &MetaError{Key: MetaKVCapacity, Value: v, Reason: reason}
	}
	bs := worker.BlockSizeOf(w)
	var c prefixindex.Capacity
	seen := map[string]bool{}
	for _, part := range strings.Split(v, ",") {
		tier, num, ok := strings.Cut(strings.TrimSpace(part), "=")
		if !ok {
			return bad("want tier=tokens pairs separated by commas, e.g. gpu=524288,cpu=4194304")
		}
		if seen[tier] {
			return bad("tier " + strconv.Quote(tier) + " given twice")
		}
		seen[tier] = true
		n, err := strconv.ParseInt(num, 10, 64)
		if err != nil || n < 0 || n > maxKVCapacityTokens {
			return bad("tier " + strconv.Quote(tier) + ": want a token count from 0 to " + strconv.Itoa(maxKVCapacityTokens))
		}
		blocks := min(int(n)/bs, prefixindex.MaxTierBlocks)
		switch tier {
		case "gpu":
			c.GPU = blocks
		case "cpu":
			c.CPU = blocks
		case "disk":
			c.Disk = blocks
		default:
			return bad("unknown tier " + strconv.Quote(tier) + ": want gpu, cpu or disk")
		}
	}
	if c.GPU < 1 {
		return bad("want a gpu tier of at least one block (" + strconv.Itoa(bs) + " tokens)")
	}
	return c, nil
}
