package cachestate

import (
	"errors"
	"testing"

	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/shoenig/test/must"
)

// buffer is a fake engine replay buffer: batch i has sequence number i.
type buffer []kvevents.Message

func (b buffer) fetch(from int64) ([]kvevents.Message, error) {
	var out []kvevents.Message
	for _, m := range b {
		if m.Seq >= from {
			out = append(out, m)
		}
	}
	return out, nil
}

// chain returns n batches storing one block each, chained, with timestamps
// from ts, and the tokens they cover.
func chain(n int, ts float64) (buffer, []uint32) {
	seq := toks(1, n*bs)
	var b buffer
	for i := range n {
		var parent *kvevents.Hash
		if i > 0 {
			parent = hp(uint64(i))
		}
		b = append(b, kvevents.Message{Seq: int64(i), Batch: kvevents.EventBatch{TS: ts + float64(i),
			Events: []kvevents.Event{stored(parent, []kvevents.Hash{h(uint64(i + 1))}, seq[i*bs:(i+1)*bs], "")}}})
	}
	return b, seq
}

// feed runs received messages through a replayer the way State.subscribe does.
func feed(t *testing.T, f *fixture, r *replayer, ms ...kvevents.Message) {
	t.Helper()
	for _, m := range ms {
		batches, replayed := r.prepare(m)
		must.NoError(t, r.apply(f.ew, batches, replayed, 0))
	}
}

func TestReplayerFillsGap(t *testing.T) {
	b, seq := chain(5, 100)
	f := newFixture(t)
	r := newReplayer(b.fetch)
	gap := b[4]
	gap.Missed = 2
	feed(t, f, r, b[0], b[1], gap)
	n, _ := f.matched(t, seq)
	must.Eq(t, 5, n)
	must.Eq(t, int64(0), f.ew.Stats().Resyncs)
	must.Eq(t, int64(1), f.ew.Stats().Replays)
}

// A reconnect is reported as Restarted; the replay of the last applied batch
// proves the publisher is the same one, so the state is kept.
func TestReplayerFillsReconnect(t *testing.T) {
	b, seq := chain(5, 100)
	f := newFixture(t)
	r := newReplayer(b.fetch)
	re := b[3]
	re.Missed, re.Restarted = 1, true
	feed(t, f, r, b[0], b[1], re)
	n, _ := f.matched(t, seq[:4*bs])
	must.Eq(t, 4, n)
	must.Eq(t, int64(0), f.ew.Stats().Resyncs)

	// A reconnect that missed nothing still needs the proof, and keeps the state.
	next := b[4]
	next.Restarted = true
	feed(t, f, r, next)
	n, _ = f.matched(t, seq)
	must.Eq(t, 5, n)
	must.Eq(t, int64(0), f.ew.Stats().Resyncs)
	must.Eq(t, int64(2), f.ew.Stats().Replays)
}

// A restarted publisher that counted past the old sequence number has other
// batches at those numbers: the proof fails and the worker resynchronises.
func TestReplayerRejectsRestartedPublisher(t *testing.T) {
	old, seq := chain(3, 100)
	f := newFixture(t)
	fresh, _ := chain(6, 500) // same numbers, other timestamps
	r := newReplayer(fresh.fetch)
	feed(t, f, r, old[0], old[1], old[2])
	m := fresh[5]
	m.Missed, m.Restarted = 2, true
	feed(t, f, r, m)
	must.Eq(t, int64(1), f.ew.Stats().Resyncs)
	n, _ := f.matched(t, seq[:3*bs])
	must.Eq(t, 0, n)
}

func TestReplayerFallsBackToResync(t *testing.T) {
	b, seq := chain(6, 100)
	for name, fetch := range map[string]ReplayFunc{
		"no endpoint":  nil,
		"error":        func(int64) ([]kvevents.Message, error) { return nil, errors.New("timeout") },
		"overrun":      buffer(b[3:]).fetch, // the last applied batch (1) is gone
		"hole":         buffer{b[1], b[2], b[4], b[5]}.fetch,
		"short replay": buffer(b[:3]).fetch,
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			r := newReplayer(fetch)
			gap := b[5]
			gap.Missed = 3
			feed(t, f, r, b[0], b[1], gap)
			must.Eq(t, int64(1), f.ew.Stats().Resyncs)
			n, _ := f.matched(t, seq[:2*bs])
			must.Eq(t, 0, n, must.Sprint("entries from before the gap must be dropped"))
		})
	}
}

// The first batch seen after subscribing: what the buffer holds before it is
// applied first, so a router that starts late knows the engine's earlier blocks.
func TestReplayerBootstrapsFromBuffer(t *testing.T) {
	b, seq := chain(4, 100)
	f := newFixture(t)
	r := newReplayer(b.fetch)
	feed(t, f, r, b[3])
	n, _ := f.matched(t, seq)
	must.Eq(t, 4, n)
	must.Eq(t, int64(1), f.ew.Stats().Replays)

	// Without replay the same start leaves the block an orphan.
	f = newFixture(t)
	feed(t, f, newReplayer(nil), b[3])
	n, _ = f.matched(t, seq)
	must.Eq(t, 0, n)
	must.Eq(t, int64(1), f.ew.Stats().Orphans)
}
