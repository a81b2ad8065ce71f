package tokens

// CacheStats returns cache hits and misses (round trips started).
func (e *Engine) CacheStats() (hits, misses int64) { return e.hits.Load(), e.misses.Load() }
