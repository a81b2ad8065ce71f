package peers

// MaxPrefixKeys bounds the block keys of the prefix records one message
// carries (about 20 bytes each in JSON: some 160 KiB, sent over TCP).
const MaxPrefixKeys = 8192

// Prefix is a routing decision for an engine without KV events: the block
// keys (a hash chain, cachestate's) of a prompt a router sent to Engine
// and the engine accepted. A peer records it as it records its own
// decisions (cachestate.State.Record), so that every router's approximate
// view of the engine's cache comes from all routers' decisions, not from
// its own 1/N sample.
type Prefix struct {
	Engine string   `json:"e"`
	Keys   []uint64 `json:"k"`
}

// Outbox holds the prefix records to send with the next message, at most
// MaxPrefixKeys keys: past it the oldest records are dropped (counted by
// Take), so that a burst of decisions never grows a message past its
// bound; a dropped record costs the peers a cache hit, not correctness.
// The zero value is empty and ready; it is not safe for concurrent use.
type Outbox struct {
	recs    []Prefix
	keys    int
	dropped int
}

// Add queues a decision. A chain longer than MaxPrefixKeys is cut to its
// first MaxPrefixKeys keys (a prefix of a chain is a chain).
func (o *Outbox) Add(engine string, keys []uint64) {
	if engine == "" || len(engine) > maxNameBytes || len(keys) == 0 {
		return
	}
	keys = append([]uint64(nil), keys[:min(len(keys), MaxPrefixKeys)]...)
	o.recs = append(o.recs, Prefix{Engine: engine, Keys: keys})
	o.keys += len(keys)
	for o.keys > MaxPrefixKeys {
		o.keys -= len(o.recs[0].Keys)
		o.recs[0] = Prefix{}
		o.recs = o.recs[1:]
		o.dropped++
	}
}

// Take returns the queued records and how many were dropped since the last
// Take, and empties the outbox.
func (o *Outbox) Take() (recs []Prefix, dropped int) {
	recs, dropped = o.recs, o.dropped
	*o = Outbox{}
	return recs, dropped
}

// Routed queues a decision for an engine without KV events for the next
// message to the peers (their Config.OnPrefixes), which it hastens
// (Changed): the router calls it
// where it records the decision itself (cachestate.State.Record).
func (p *Peers) Routed(engine string, keys []uint64) {
	if p.cfg.CountOnly {
		return
	}
	p.mu.Lock()
	p.out.Add(engine, keys)
	p.mu.Unlock()
	p.Changed()
}
