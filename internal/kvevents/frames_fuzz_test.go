package kvevents

import (
	"context"
	"encoding/binary"
	"testing"

	"github.com/shoenig/test/must"
)

// FuzzParseFrames feeds arbitrary multipart messages, as a SUB socket hands
// them over from an engine's PUB endpoint, to parseFrames (FuzzDecode covers
// the payload alone). The frames are packed as count, then length-prefixed
// frames. An accepted message has exactly [topic, 8-byte big-endian seq,
// payload], carries them unchanged, and its batch is Decode's.
func FuzzParseFrames(f *testing.F) {
	payload, err := Encode(sampleBatch(), LayoutArray)
	if err != nil {
		f.Fatal(err)
	}
	seq := binary.BigEndian.AppendUint64(nil, 7)
	f.Add(packFrames([]byte("kv"), seq, payload))
	f.Add(packFrames(nil, seq, payload))
	f.Add(packFrames([]byte("kv"), []byte{1, 2, 3}, payload))
	f.Add(packFrames([]byte("kv"), seq))
	f.Add(packFrames([]byte("kv"), binary.BigEndian.AppendUint64(nil, 1<<63), []byte{0x90}))
	f.Fuzz(func(t *testing.T, data []byte) {
		frames := unpackFrames(data)
		m, err := parseFrames(frames)
		if err != nil {
			return
		}
		if len(frames) != 3 || len(frames[1]) != 8 {
			t.Fatalf("accepted %d frames, sequence frame %d bytes", len(frames), len(frames[1]))
		}
		must.Eq(t, string(frames[0]), m.Topic)
		must.Eq(t, int64(binary.BigEndian.Uint64(frames[1])), m.Seq)
		b, err := Decode(frames[2])
		must.NoError(t, err)
		must.Eq(t, b.Events, m.Batch.Events)
		if m.Missed != 0 || m.Restarted {
			t.Fatalf("parseFrames set sequence flags: %+v", m)
		}
	})
}

// packFrames is the fuzz input encoding of a multipart message.
func packFrames(frames ...[]byte) []byte {
	out := []byte{byte(len(frames))}
	for _, fr := range frames {
		out = binary.BigEndian.AppendUint16(out, uint16(len(fr)))
		out = append(out, fr...)
	}
	return out
}

// unpackFrames reads packFrames' encoding, truncating what runs short.
func unpackFrames(data []byte) [][]byte {
	if len(data) == 0 {
		return nil
	}
	n, data := int(data[0]), data[1:]
	var frames [][]byte
	for i := 0; i < n && len(data) >= 2; i++ {
		l := int(binary.BigEndian.Uint16(data))
		data = data[2:]
		l = min(l, len(data))
		frames = append(frames, data[:l])
		data = data[l:]
	}
	return frames
}

// FuzzSequence feeds arbitrary runs of (sequence number, connection epoch)
// through Next's gap and restart accounting: the router resynchronises a
// worker's cache view on Restarted and asks for replay on Missed, so a wrong
// flag either drops a worker's prefix index or keeps a stale one. Each 9
// input bytes are one message: an 8-byte big-endian seq and an epoch byte.
// Properties, for every message after one with seq >= 0: Missed >= 0; a seq
// that does not increase, or a new connection, is Restarted; otherwise
// seq = previous + 1 + Missed exactly (no batch is counted twice or lost).
func FuzzSequence(f *testing.F) {
	msg := func(seq uint64, epoch byte) []byte { return append(binary.BigEndian.AppendUint64(nil, seq), epoch) }
	cat := func(ms ...[]byte) (out []byte) {
		for _, m := range ms {
			out = append(out, m...)
		}
		return out
	}
	f.Add(cat(msg(0, 0), msg(1, 0), msg(2, 0)))
	f.Add(cat(msg(0, 0), msg(5, 0), msg(6, 1)))
	f.Add(cat(msg(9, 0), msg(3, 0), msg(4, 0)))
	f.Add(cat(msg(1<<63-1, 0), msg(1<<63, 0), msg(0, 0)))
	f.Add(cat(msg(1<<63-2, 0), msg(1<<63-1, 0)))
	f.Fuzz(func(t *testing.T, data []byte) {
		n := len(data) / 9
		s := &Subscriber{msgs: make(chan recvd, n), done: make(chan struct{}), lastSeq: -1}
		for i := range n {
			s.msgs <- recvd{msg: Message{Seq: int64(binary.BigEndian.Uint64(data[9*i:]))}, epoch: int64(data[9*i+8])}
		}
		prev, prevEpoch := int64(-1), int64(0)
		for i := range n {
			m, err := s.Next(context.Background())
			must.NoError(t, err)
			epoch := int64(data[9*i+8])
			if m.Missed < 0 {
				t.Fatalf("message %d: Missed %d", i, m.Missed)
			}
			if prev >= 0 {
				switch {
				case m.Seq <= prev || epoch != prevEpoch:
					if !m.Restarted {
						t.Fatalf("message %d: seq %d after %d (epoch %d after %d) not Restarted", i, m.Seq, prev, epoch, prevEpoch)
					}
				case m.Restarted:
					t.Fatalf("message %d: seq %d after %d on one connection marked Restarted", i, m.Seq, prev)
				case m.Seq != prev+1+m.Missed:
					t.Fatalf("message %d: seq %d after %d with Missed %d", i, m.Seq, prev, m.Missed)
				}
			} else if m.Missed != 0 || m.Restarted {
				t.Fatalf("message %d: first message flagged %+v", i, m)
			}
			prev, prevEpoch = m.Seq, epoch
		}
	})
}
