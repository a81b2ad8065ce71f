package peers

import "time"

// Schedule is when a router sends its load: as soon as its own load
// changed (Changed), but never sooner than MinInterval after its last
// message, and at least every Interval without a change (a heartbeat: it
// refreshes the peers' view of an idle router, repairs a lost packet and
// keeps the load from going stale). Peers.Run follows it, and so does the
// cluster simulator's model of the routers (bench/cluster), so both run
// one timing rule. Times are offsets from any fixed origin. The zero
// Schedule is due at once; it is not safe for concurrent use.
type Schedule struct {
	Interval    time.Duration // heartbeat: the longest time between messages
	MinInterval time.Duration // the shortest time between messages

	last  time.Duration
	sent  bool
	dirty bool
}

// Changed records that the load changed since the last message.
func (s *Schedule) Changed() { s.dirty = true }

// Sent records a message sent at now.
func (s *Schedule) Sent(now time.Duration) { s.last, s.sent, s.dirty = now, true, false }

// Next is when the next message is due (at or before now: due now).
func (s *Schedule) Next() time.Duration {
	switch {
	case !s.sent:
		return 0
	case s.dirty:
		return s.last + s.MinInterval
	default:
		return s.last + s.Interval
	}
}
