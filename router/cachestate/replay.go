package cachestate

import (
	"github.com/oasis-llm/oasis/internal/kvevents"
)

// replayer fills what one engine's subscriber missed from the engine's replay
// buffer (vLLM's replay_endpoint: a ZMQ ROUTER that re-sends buffered batches
// from a sequence number), so the worker's state survives:
//
//   - a sequence gap (batches dropped at the PUB socket's high-water mark);
//   - a reconnect, which the subscriber reports as Restarted because the
//     publisher may have restarted: the replay from the last applied batch
//     must return that very batch (same sequence number, timestamp and event
//     count), which proves the publisher is the one whose batches were
//     applied; a restarted publisher's batch at that number is a different one;
//   - the first batch after subscribing: the buffer's earlier batches are
//     applied first, so blocks stored before the router subscribed are known.
//
// Anything replay cannot vouch for falls back to EventWorker.Apply, which
// resynchronises. Not safe for concurrent use: the engine's subscribe loop
// owns it.
type replayer struct {
	fetch   ReplayFunc // nil without a replay endpoint
	lastSeq int64      // sequence number of the last applied batch, -1 before any
	lastTS  float64
	lastN   int
}

func newReplayer(fetch ReplayFunc) *replayer { return &replayer{fetch: fetch, lastSeq: -1} }

// prepare returns the batches to apply for m, in order, m last, with their
// gap marks cleared when replay filled the gap; it returns m alone (marks
// kept, so Apply resynchronises) when replay cannot fill it. It does the
// network round trip, so call it without holding the worker's lock.
func (r *replayer) prepare(m kvevents.Message) (batches []kvevents.Message, replayed bool) {
	if r.fetch == nil {
		return []kvevents.Message{m}, false
	}
	var from int64
	switch {
	case r.lastSeq < 0 && m.Missed == 0 && !m.Restarted:
		if m.Seq == 0 {
			return []kvevents.Message{m}, false // nothing came before
		}
		from = 0 // first batch seen: learn what the buffer holds before it
	case r.lastSeq >= 0 && (m.Missed > 0 || m.Restarted) && m.Seq > r.lastSeq:
		from = r.lastSeq // the last applied batch comes back first, as proof
	default:
		return []kvevents.Message{m}, false
	}
	got, err := r.fetch(from)
	if err != nil {
		return []kvevents.Message{m}, false
	}
	next := int64(-1)
	var fill []kvevents.Message
	for _, g := range got {
		if g.Seq >= m.Seq {
			break
		}
		if next < 0 {
			if r.lastSeq >= 0 {
				if g.Seq != r.lastSeq || g.Batch.TS != r.lastTS || len(g.Batch.Events) != r.lastN {
					return []kvevents.Message{m}, false // another publisher's batch: resync
				}
				next = g.Seq + 1
				continue
			}
			next = g.Seq // bootstrap: the buffer may have wrapped past 0
		}
		if g.Seq != next {
			return []kvevents.Message{m}, false // a hole in the replay
		}
		g.Missed, g.Restarted = 0, false
		fill = append(fill, g)
		next++
	}
	if r.lastSeq >= 0 && next != m.Seq {
		return []kvevents.Message{m}, false // the buffer no longer reaches back
	}
	if r.lastSeq < 0 && next >= 0 && next != m.Seq {
		return []kvevents.Message{m}, false
	}
	m.Missed, m.Restarted = 0, false
	return append(fill, m), r.lastSeq >= 0 || len(fill) > 0
}

// apply applies what prepare returned and remembers the last batch.
func (r *replayer) apply(w *EventWorker, batches []kvevents.Message, replayed bool, now int64) error {
	if replayed {
		w.stats.Replays++
	}
	for _, b := range batches {
		if err := w.Apply(b, now); err != nil {
			r.reset()
			return err
		}
	}
	r.applied(batches[len(batches)-1])
	return nil
}

// applied remembers m as the last batch applied.
func (r *replayer) applied(m kvevents.Message) {
	r.lastSeq, r.lastTS, r.lastN = m.Seq, m.Batch.TS, len(m.Batch.Events)
}

// reset forgets the last batch: the worker was resynchronised outside apply.
func (r *replayer) reset() { r.lastSeq = -1 }
