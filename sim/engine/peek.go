package engine

// CachedPrefixBlocks reports how many leading blocks of a prompt, given as its
// chained block hashes (BlockHash over each full block of BlockSize tokens),
// the GPU prefix cache holds now. It changes nothing (no LRU touch, no
// events): it is what a router with an exact, up-to-date view of the
// engine's cache (KV events without delay or loss) would see. The CPU and
// disk tiers are not consulted.
func (e *Engine) CachedPrefixBlocks(hashes []uint64) int {
	if e.cfg.DisablePrefixCaching {
		return 0
	}
	for k, h := range hashes {
		if _, ok := e.pool.lookup(h); !ok {
			return k
		}
	}
	return len(hashes)
}
