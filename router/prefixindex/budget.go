package prefixindex

// The global budget (Config.MaxEntries). Each worker's capacity bounds its
// own entries, but not how many workers there are nor what their capacities
// add up to; the budget bounds the sum. A new entry past it evicts the least
// recently stored entry of all workers: the oldest of the workers' LRU tails
// by store stamp (ties: the worker with more entries, counting the storing
// worker's new one), so the index keeps
// what was stored last whoever stored it, like one LRU across workers.
//
// Finding the oldest tail scans the workers; the scan also notes the runner
// up, and evictions continue from the same victim, without a scan, while its
// tail is still no newer than the runner up's was (with as many entries as
// the runner up has now, for ties). Other workers' tails only get newer
// between scans (their entries are refreshed, removed or evicted; new
// entries go to the front), so the victim stays the oldest: one scan per
// run of evictions, not per evicted entry.

// budget is the state of MaxEntries eviction.
type budget struct {
	victim *worker // the worker evictions continue from; nil: scan
	// The runner up at the last scan (nil: none), and its tail's stamp then.
	next      *worker
	nextStamp uint32
	evicted   uint64 // entries evicted for the budget, ever
}

// forget drops w, which was removed, from the budget's state.
func (b *budget) forget(w *worker) {
	if b.victim == w || b.next == w {
		b.victim, b.next = nil, nil
	}
}

// older reports whether a tail with stamp sa of a worker with ca entries is
// evicted before one with stamp sb of a worker with cb entries. Stamps are
// milliseconds that wrap: compared by difference.
func older(sa uint32, ca int, sb uint32, cb int) bool {
	if d := int32(sa - sb); d != 0 {
		return d < 0
	}
	return ca > cb
}

// size is w's entry count for ties, with the entry storing is adding.
func size(w, storing *worker) int {
	if w == storing {
		return w.count + 1
	}
	return w.count
}

// evictOldest evicts the least recently stored entry of all workers, to make
// room for an entry of storing. The index holds at least one entry.
func (ix *Index) evictOldest(storing *worker) {
	b := &ix.budget
	v := b.victim
	if v == nil || v.count == 0 || b.next != nil &&
		older(b.nextStamp, size(b.next, storing), ix.node(v.lruTail()).stamp, size(v, storing)) {
		v = ix.scanVictim(storing)
	}
	ix.unlink(v, v.lruTail())
	b.evicted++
}

// scanVictim finds the worker with the oldest tail, and the runner up.
func (ix *Index) scanVictim(storing *worker) *worker {
	b := &ix.budget
	var best *worker
	var bestStamp uint32
	b.next = nil
	for _, w := range ix.bySlot {
		if w == nil || w.count == 0 {
			continue
		}
		st := ix.node(w.lruTail()).stamp
		switch {
		case best == nil:
			best, bestStamp = w, st
		case older(st, size(w, storing), bestStamp, size(best, storing)):
			b.next, b.nextStamp = best, bestStamp
			best, bestStamp = w, st
		case b.next == nil || older(st, size(w, storing), b.nextStamp, size(b.next, storing)):
			b.next, b.nextStamp = w, st
		}
	}
	b.victim = best
	return best
}
