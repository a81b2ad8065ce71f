package kvevents

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/shoenig/test/must"
	"github.com/vmihailenco/msgpack/v5"
)

func sampleBatch() EventBatch {
	parent := HashUint64(7)
	lora := int64(3)
	rank := 0
	return EventBatch{
		TS: 1732060800.5,
		Events: []Event{
			BlockStored{
				BlockHashes:     []Hash{HashUint64(11), HashUint64(1<<63 + 5)},
				ParentBlockHash: &parent,
				TokenIDs:        []int32{1, 2, 3, 4, 5, 6, 7, 8},
				BlockSize:       4,
				LoraID:          &lora,
				Medium:          MediumGPU,
				LoraName:        "adapter",
			},
			BlockStored{BlockHashes: []Hash{HashBytes(bytes.Repeat([]byte{0xab}, 32))}, TokenIDs: []int32{9, 9, 9, 9}, BlockSize: 4},
			BlockRemoved{BlockHashes: []Hash{HashUint64(11)}, Medium: MediumGPU},
			AllBlocksCleared{},
		},
		DataParallelRank: &rank,
	}
}

func TestRoundTrip(t *testing.T) {
	for _, layout := range []Layout{LayoutMap, LayoutArray} {
		payload, err := Encode(sampleBatch(), layout)
		must.NoError(t, err)
		got, err := Decode(payload)
		must.NoError(t, err)
		must.Eq(t, sampleBatch(), got)
	}
}

// derefEvents turns a Decoder's pointer events into Decode's values.
func derefEvents(evs []Event) []Event {
	var out []Event
	for _, ev := range evs {
		switch e := ev.(type) {
		case *BlockStored:
			out = append(out, *e)
		case *BlockRemoved:
			out = append(out, *e)
		default:
			out = append(out, e)
		}
	}
	return out
}

// A reused Decoder gives the same batches as Decode, one after another, in both
// layouts, without allocating once its buffers have grown.
func TestDecoderReuse(t *testing.T) {
	var payloads [][]byte
	for _, layout := range []Layout{LayoutMap, LayoutArray} {
		p, err := Encode(sampleBatch(), layout)
		must.NoError(t, err)
		payloads = append(payloads, p)
		other := EventBatch{TS: 2, Events: []Event{BlockRemoved{BlockHashes: []Hash{HashUint64(1), HashUint64(2), HashUint64(3)}}}}
		p, err = Encode(other, layout)
		must.NoError(t, err)
		payloads = append(payloads, p)
	}
	var d Decoder
	for round := 0; round < 2; round++ {
		for _, p := range payloads {
			want, err := Decode(p)
			must.NoError(t, err)
			got, err := d.Decode(p)
			must.NoError(t, err)
			must.Eq(t, want.TS, got.TS)
			must.Eq(t, want.DataParallelRank, got.DataParallelRank)
			must.Eq(t, want.Events, derefEvents(got.Events))
		}
	}
	allocs := testing.AllocsPerRun(20, func() {
		if _, err := d.Decode(payloads[1]); err != nil {
			t.Fatal(err)
		}
	})
	must.Eq(t, 0.0, allocs)
}

// Field keys before "type" in a map event (a map has no order) still decode.
func TestDecodeMapTypeLast(t *testing.T) {
	payload := mustMarshal(t, []any{1.0, []any{
		map[string]any{"token_ids": []any{1, 2}, "block_hashes": []any{7}, "block_size": 2, "parent_block_hash": 3, "medium": "CPU", "type": "BlockStored"},
	}, 0})
	var d Decoder
	b, err := d.Decode(payload)
	must.NoError(t, err)
	three := HashUint64(3)
	must.Eq(t, []Event{BlockStored{BlockHashes: []Hash{HashUint64(7)}, ParentBlockHash: &three, TokenIDs: []int32{1, 2}, BlockSize: 2, Medium: "CPU"}}, derefEvents(b.Events))
	for _, bad := range [][]byte{
		{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}, // forged array32 length
		{0x92, 0x01, 0x91, 0x92, 0xa3, 'x', 'y'},                           // short string
		{0x92, 0x01, 0x91, 0xc1},                                           // reserved code
	} {
		_, err := d.Decode(bad)
		must.Error(t, err)
	}
}

// Plain structs decoded with vmihailenco/msgpack, independent of this package's decoder.
type plainBatch struct {
	//lint:ignore U1000 read by msgpack through reflection: decode the array as a struct
	_msgpack struct{} `msgpack:",as_array"`
	TS       float64
	Events   []msgpack.RawMessage
	Rank     *int
}

type plainStored struct {
	Type            string  `msgpack:"type"`
	BlockHashes     []any   `msgpack:"block_hashes"`
	ParentBlockHash any     `msgpack:"parent_block_hash"`
	TokenIDs        []int32 `msgpack:"token_ids"`
	BlockSize       int     `msgpack:"block_size"`
	LoraID          *int    `msgpack:"lora_id"`
	Medium          *string `msgpack:"medium"`
	LoraName        *string `msgpack:"lora_name"`
}

type plainStoredArray struct {
	//lint:ignore U1000 read by msgpack through reflection: decode the array as a struct
	_msgpack        struct{} `msgpack:",as_array"`
	Type            string
	BlockHashes     []any
	ParentBlockHash any
	TokenIDs        []int32
	BlockSize       int
	LoraID          *int
	Medium          *string
	LoraName        *string
}

func TestIndependentDecode(t *testing.T) {
	payload, err := Encode(sampleBatch(), LayoutMap)
	must.NoError(t, err)
	var pb plainBatch
	must.NoError(t, msgpack.Unmarshal(payload, &pb))
	must.Eq(t, 1732060800.5, pb.TS)
	must.Eq(t, 0, *pb.Rank)
	must.Len(t, 4, pb.Events)
	var st plainStored
	must.NoError(t, msgpack.Unmarshal(pb.Events[0], &st))
	must.Eq(t, "BlockStored", st.Type)
	must.Eq(t, []int32{1, 2, 3, 4, 5, 6, 7, 8}, st.TokenIDs)
	must.Eq(t, 4, st.BlockSize)
	must.Eq(t, 3, *st.LoraID)
	must.Eq(t, "GPU", *st.Medium)
	must.Eq(t, "adapter", *st.LoraName)
	must.Eq(t, []any{uint64(11), uint64(1<<63 + 5)}, normalise(st.BlockHashes))
	must.Eq(t, any(uint64(7)), normalise([]any{st.ParentBlockHash})[0])
	var st2 plainStored
	must.NoError(t, msgpack.Unmarshal(pb.Events[1], &st2))
	must.Nil(t, st2.ParentBlockHash)
	must.Eq(t, bytes.Repeat([]byte{0xab}, 32), st2.BlockHashes[0].([]byte))
	var rm map[string]any
	must.NoError(t, msgpack.Unmarshal(pb.Events[2], &rm))
	must.Eq(t, "BlockRemoved", rm["type"])
	must.Eq(t, "GPU", rm["medium"])
	var cl map[string]any
	must.NoError(t, msgpack.Unmarshal(pb.Events[3], &cl))
	must.Eq(t, map[string]any{"type": "AllBlocksCleared"}, cl)

	payload, err = Encode(sampleBatch(), LayoutArray)
	must.NoError(t, err)
	must.NoError(t, msgpack.Unmarshal(payload, &pb))
	var sa plainStoredArray
	must.NoError(t, msgpack.Unmarshal(pb.Events[0], &sa))
	must.Eq(t, "BlockStored", sa.Type)
	must.Eq(t, []int32{1, 2, 3, 4, 5, 6, 7, 8}, sa.TokenIDs)
	must.Eq(t, "adapter", *sa.LoraName)
}

// normalise maps msgpack's compact integer decodings to uint64.
func normalise(vs []any) []any {
	out := make([]any, len(vs))
	for i, v := range vs {
		switch x := v.(type) {
		case int8:
			out[i] = uint64(x)
		case int16:
			out[i] = uint64(x)
		case int32:
			out[i] = uint64(x)
		case int64:
			out[i] = uint64(x)
		case uint8:
			out[i] = uint64(x)
		case uint16:
			out[i] = uint64(x)
		case uint32:
			out[i] = uint64(x)
		default:
			out[i] = v
		}
	}
	return out
}

// Payloads as other producers write them: older vLLM's array layout with trailing
// defaults omitted and extra fields, negative builtin-hash integers, map events with
// unknown keys in any order, unknown event types.
func TestDecodeForeignPayloads(t *testing.T) {
	payload, err := msgpack.Marshal([]any{
		1.5,
		[]any{
			[]any{"BlockStored", []any{int64(-2), uint64(9)}, nil, []any{1, 2}, 2},
			[]any{"BlockStored", []any{1}, 5, []any{3, 4}, 2, nil, "CPU", nil, "extra-field"},
			map[string]any{"block_hashes": []any{1}, "medium": "STORAGE", "new_key": 1, "type": "BlockRemoved"},
			[]any{"SomethingNew", 1, 2},
			[]any{"AllBlocksCleared"},
		},
	})
	must.NoError(t, err)
	b, err := Decode(payload)
	must.NoError(t, err)
	must.Eq(t, 1.5, b.TS)
	must.Nil(t, b.DataParallelRank)
	five := HashUint64(5)
	must.Eq(t, []Event{
		BlockStored{BlockHashes: []Hash{HashUint64(uint64(1<<64 - 2)), HashUint64(9)}, TokenIDs: []int32{1, 2}, BlockSize: 2},
		BlockStored{BlockHashes: []Hash{HashUint64(1)}, ParentBlockHash: &five, TokenIDs: []int32{3, 4}, BlockSize: 2, Medium: "CPU"},
		BlockRemoved{BlockHashes: []Hash{HashUint64(1)}, Medium: "STORAGE"},
		AllBlocksCleared{},
	}, b.Events)

	for _, bad := range [][]byte{nil, {0xc1}, mustMarshal(t, "str"), mustMarshal(t, []any{1.0, []any{map[string]any{"x": 1}}})} {
		_, err := Decode(bad)
		must.Error(t, err)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	b, err := msgpack.Marshal(v)
	must.NoError(t, err)
	return b
}

func TestHash(t *testing.T) {
	h := HashUint64(0x0102030405060708)
	v, ok := h.Uint64()
	must.True(t, ok)
	must.Eq(t, uint64(0x0102030405060708), v)
	must.Eq(t, []byte{1, 2, 3, 4, 5, 6, 7, 8}, h.Bytes())
	hb := HashBytes([]byte{0xde, 0xad})
	must.True(t, hb.IsBytes())
	must.Eq(t, "dead", hb.String())
	m := map[Hash]int{h: 1, hb: 2}
	must.Eq(t, 2, m[HashBytes([]byte{0xde, 0xad})])
}

// publishUntil publishes b every 20ms until received returns true (the ZMQ slow-joiner
// problem: a PUB drops messages until the subscription arrives).
func publishUntil(t *testing.T, p *Publisher, b EventBatch, received func() bool) {
	t.Helper()
	testutil.EventuallyEvery(t, 10*time.Second, 20*time.Millisecond, "the subscriber to receive a batch", func() bool {
		if received() {
			return true
		}
		_, err := p.Publish(b)
		must.NoError(t, err)
		return false
	})
}

func TestPubSubOverZMQ(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", Topic: "kv@sim"})
	must.NoError(t, err)
	defer p.Close()
	go p.Run(ctx)
	ep := "tcp://" + p.Addr().String()

	// An independent raw SUB socket and plain-struct decoding.
	raw := zmq4.NewSub(ctx)
	defer raw.Close()
	must.NoError(t, raw.Dial(ep))
	must.NoError(t, raw.SetOption(zmq4.OptionSubscribe, "kv@sim"))
	got := make(chan zmq4.Msg, 1)
	go func() {
		m, err := raw.Recv()
		if err == nil {
			got <- m
		}
	}()
	var msg zmq4.Msg
	publishUntil(t, p, sampleBatch(), func() bool {
		select {
		case msg = <-got:
			return true
		default:
			return false
		}
	})
	must.Len(t, 3, msg.Frames)
	must.Eq(t, "kv@sim", string(msg.Frames[0]))
	must.Len(t, 8, msg.Frames[1])
	var pb plainBatch
	must.NoError(t, msgpack.Unmarshal(msg.Frames[2], &pb))
	var st plainStored
	must.NoError(t, msgpack.Unmarshal(pb.Events[0], &st))
	must.Eq(t, []int32{1, 2, 3, 4, 5, 6, 7, 8}, st.TokenIDs)

	// The package's Subscriber.
	s, err := NewSubscriber(SubscriberConfig{Endpoint: ep, Topic: "kv@sim", ReplayEndpoint: "tcp://" + p.ReplayAddr().String()})
	must.NoError(t, err)
	defer s.Close()
	go s.Run(ctx)
	first := make(chan Message, 1)
	go func() {
		m, err := s.Next(ctx)
		if err == nil {
			first <- m
		}
	}()
	var m Message
	publishUntil(t, p, sampleBatch(), func() bool {
		select {
		case m = <-first:
			return true
		default:
			return false
		}
	})
	must.Eq(t, sampleBatch(), m.Batch)
	must.Eq(t, "kv@sim", m.Topic)
	// Consecutive batches arrive in order with no gap.
	next, err := p.Publish(EventBatch{TS: 2, Events: []Event{AllBlocksCleared{}}})
	must.NoError(t, err)
	for {
		m2, err := s.Next(ctx)
		must.NoError(t, err)
		if m2.Seq == next {
			must.Eq(t, int64(0), m2.Missed)
			must.Eq(t, []Event{AllBlocksCleared{}}, m2.Batch.Events)
			break
		}
	}

	// Replay returns every buffered batch from a sequence number on, in order.
	rep, err := s.Replay(ctx, next-1)
	must.NoError(t, err)
	must.Len(t, 2, rep)
	must.Eq(t, next-1, rep[0].Seq)
	must.Eq(t, next, rep[1].Seq)
	must.Eq(t, []Event{AllBlocksCleared{}}, rep[1].Batch.Events)
	rep, err = Replay(ctx, "tcp://"+p.ReplayAddr().String(), "", next+1)
	must.NoError(t, err)
	must.Len(t, 0, rep)
}

func TestReplayBufferBound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0", BufferSize: 3})
	must.NoError(t, err)
	defer p.Close()
	go p.Run(ctx)
	for i := range 5 {
		_, err := p.Publish(EventBatch{TS: float64(i)})
		must.NoError(t, err)
	}
	rep, err := Replay(ctx, "tcp://"+p.ReplayAddr().String(), "", 0)
	must.NoError(t, err)
	seqs := []int64{}
	for _, m := range rep {
		seqs = append(seqs, m.Seq)
	}
	must.Eq(t, []int64{2, 3, 4}, seqs)
}

func TestSubscriberGapAndRestart(t *testing.T) {
	s := &Subscriber{msgs: make(chan recvd, 8), done: make(chan struct{}), lastSeq: -1}
	for _, seq := range []int64{0, 1, 4, 2} {
		s.msgs <- recvd{msg: Message{Seq: seq}}
	}
	ctx := context.Background()
	want := []struct {
		missed    int64
		restarted bool
	}{{0, false}, {0, false}, {2, false}, {0, true}}
	for i, w := range want {
		m, err := s.Next(ctx)
		must.NoError(t, err)
		must.Eq(t, w.missed, m.Missed, must.Sprint(i))
		must.Eq(t, w.restarted, m.Restarted, must.Sprint(i))
	}
}

// A reconnect marks the next message Restarted even when its sequence number is
// exactly the next one (a restarted publisher that happened to count that far).
func TestSubscriberReconnectIsRestart(t *testing.T) {
	s := &Subscriber{msgs: make(chan recvd, 8), done: make(chan struct{}), lastSeq: -1}
	s.msgs <- recvd{msg: Message{Seq: 0}, epoch: 1}
	s.msgs <- recvd{msg: Message{Seq: 1}, epoch: 1}
	s.msgs <- recvd{msg: Message{Seq: 2}, epoch: 2}
	s.msgs <- recvd{msg: Message{Seq: 3}, epoch: 2}
	ctx := context.Background()
	for i, want := range []bool{false, false, true, false} {
		m, err := s.Next(ctx)
		must.NoError(t, err)
		must.Eq(t, want, m.Restarted, must.Sprint(i))
		must.Eq(t, int64(0), m.Missed)
	}
}

func TestParseFrames(t *testing.T) {
	payload, err := Encode(EventBatch{TS: 1}, LayoutMap)
	must.NoError(t, err)
	seq := make([]byte, 8)
	binary.BigEndian.PutUint64(seq, 42)
	m, err := parseFrames([][]byte{[]byte("t"), seq, payload})
	must.NoError(t, err)
	must.Eq(t, int64(42), m.Seq)
	for i, frames := range [][][]byte{{seq, payload}, {nil, seq[:4], payload}, {nil, seq, []byte{0x01}}} {
		_, err := parseFrames(frames)
		must.Error(t, err, must.Sprint(fmt.Sprint(i)))
	}
}

// A subscriber survives the engine restarting on the same endpoint and reports the
// sequence reset, so consumers drop the engine's old blocks.
func TestSubscriberSeesPublisherRestart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p1, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:0"})
	must.NoError(t, err)
	ep := "tcp://" + p1.Addr().String()
	s, err := NewSubscriber(SubscriberConfig{Endpoint: ep})
	must.NoError(t, err)
	defer s.Close()
	go s.Run(ctx)

	recv := make(chan Message, 64)
	go func() {
		for {
			m, err := s.Next(ctx)
			if err != nil {
				return
			}
			recv <- m
		}
	}()
	waitFor := func(p *Publisher, pred func(Message) bool) Message {
		deadline := time.Now().Add(15 * time.Second)
		for time.Now().Before(deadline) {
			_, err := p.Publish(EventBatch{TS: 1})
			must.NoError(t, err)
			select {
			case m := <-recv:
				if pred(m) {
					return m
				}
			case <-time.After(50 * time.Millisecond):
			}
		}
		t.Fatal("message not received")
		return Message{}
	}
	// Advance p1's sequence well past where p2 will start.
	for range 10 {
		_, err := p1.Publish(EventBatch{TS: 1})
		must.NoError(t, err)
	}
	waitFor(p1, func(m Message) bool { return m.Seq >= 10 })
	must.NoError(t, p1.Close())

	p2, err := NewPublisher(PublisherConfig{Endpoint: ep})
	must.NoError(t, err)
	defer p2.Close()
	// p1's last messages may still be on their way (they carry seq >= 10):
	// the first of p2's is the one the subscriber must flag.
	m := waitFor(p2, func(m Message) bool { return m.Seq < 10 })
	must.True(t, m.Restarted)
}

func TestSubscriberBeforePublisher(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ep := "tcp://" + testutil.FreeAddr(t)
	s, err := NewSubscriber(SubscriberConfig{Endpoint: ep, Topic: "t"})
	must.NoError(t, err)
	defer s.Close()
	go s.Run(ctx)
	testutil.Eventually(t, 10*time.Second, "the subscriber to retry its dial", func() bool { return s.tracker.refused.Load() >= 2 })
	p, err := NewPublisher(PublisherConfig{Endpoint: ep, Topic: "t"})
	must.NoError(t, err)
	defer p.Close()
	got := make(chan Message, 1)
	go func() {
		if m, err := s.Next(ctx); err == nil {
			got <- m
		}
	}()
	publishUntil(t, p, EventBatch{TS: 3}, func() bool {
		select {
		case m := <-got:
			must.Eq(t, 3.0, m.Batch.TS)
			return true
		default:
			return false
		}
	})
}

// FuzzDecode: any payload decodes or fails with an error, never a panic or a huge
// allocation from a forged length prefix.
func FuzzDecode(f *testing.F) {
	for _, l := range []Layout{LayoutMap, LayoutArray} {
		p, err := Encode(sampleBatch(), l)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(p)
	}
	f.Add([]byte{0x93, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff}) // array32 of 4G events
	var d Decoder
	f.Fuzz(func(t *testing.T, payload []byte) {
		b, err := Decode(payload)
		reused, rerr := d.Decode(payload)
		if (err == nil) != (rerr == nil) {
			t.Fatalf("Decode error %v, Decoder error %v", err, rerr)
		}
		if err != nil {
			return
		}
		must.Eq(t, b.Events, derefEvents(reused.Events))
		// What decodes re-encodes and decodes to the same batch.
		again, err := Encode(b, LayoutMap)
		if err != nil {
			t.Fatal(err)
		}
		b2, err := Decode(again)
		if err != nil {
			t.Fatal(err)
		}
		must.Eq(t, len(b.Events), len(b2.Events))
	})
}

// Replay asks the engine's replay endpoint for every buffered batch with seq >= from.
// It does not change what Next reports.
func (s *Subscriber) Replay(ctx context.Context, from int64) ([]Message, error) {
	if s.cfg.ReplayEndpoint == "" {
		return nil, errors.New("kv-events replay: no replay endpoint configured")
	}
	return Replay(ctx, s.cfg.ReplayEndpoint, s.cfg.Topic, from)
}
