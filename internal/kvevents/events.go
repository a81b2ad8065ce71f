// Package kvevents is vLLM's KV-cache event wire format and its ZMQ transport, in pure Go.
//
// Wire format (vllm/distributed/kv_events.py): a ZMQ PUB socket sends 3-frame messages
// [topic, seq, payload], seq an 8-byte big-endian counter starting at 0, payload a
// msgpack EventBatch array [ts float64, events array, data_parallel_rank int|nil].
// Each event is a tagged union on its type name, encoded either as a map with a "type"
// key (current builds) or as an array ["BlockStored", field, ...] in field order (older
// builds, msgspec array_like; trailing default fields may be omitted). Block hashes are
// integers (uint64; Python's builtin hash may be negative and is then sent as int64) or
// 32-byte bins (sha256). Decode accepts all of these; Encode writes either layout.
//
// A ROUTER socket on the replay endpoint answers a request [identity, "", start_seq]
// with [identity, "", seq, payload] for every buffered batch with seq >= start_seq and
// then [identity, "", -1, ""] (see Publisher and Subscriber.Replay).
package kvevents

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// Storage media vLLM names in events.
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
)

// Hash is an engine block hash as sent on the wire: an integer or a byte string. It is
// comparable, so it can key maps; the zero Hash is the integer 0.
type Hash struct {
	n       uint64
	b       string
	isBytes bool
}

// HashUint64 returns the integer hash v.
func HashUint64(v uint64) Hash { return Hash{n: v} }

// HashBytes returns the byte-string hash b (e.g. 32 bytes of sha256).
func HashBytes(b []byte) Hash { return Hash{b: string(b), isBytes: true} }

// Uint64 returns the integer form and true, or 0 and false for a byte-string hash.
func (h Hash) Uint64() (uint64, bool) { return h.n, !h.isBytes }

// Bytes returns the byte-string form, or the integer as 8 big-endian bytes.
func (h Hash) Bytes() []byte {
	if h.isBytes {
		return []byte(h.b)
	}
	var b [8]byte
	for i := range 8 {
		b[i] = byte(h.n >> (56 - 8*i))
	}
	return b[:]
}

// IsBytes reports whether the hash travelled as a byte string.
func (h Hash) IsBytes() bool { return h.isBytes }

func (h Hash) String() string {
	if h.isBytes {
		return hex.EncodeToString([]byte(h.b))
	}
	return strconv.FormatUint(h.n, 10)
}

// Event is one of BlockStored, BlockRemoved, AllBlocksCleared.
type Event interface{ eventType() string }

// BlockStored says consecutive full blocks were stored. BlockHashes[i] holds tokens
// TokenIDs[i*BlockSize:(i+1)*BlockSize]; ParentBlockHash is the hash of the block before
// BlockHashes[0] in the sequence, nil for the first block.
type BlockStored struct {
	BlockHashes     []Hash
	ParentBlockHash *Hash
	TokenIDs        []int32
	BlockSize       int
	LoraID          *int64
	Medium          string // "" when not sent
	LoraName        string // "" when not sent
}

// BlockRemoved says blocks were evicted from Medium.
type BlockRemoved struct {
	BlockHashes []Hash
	Medium      string
}

// AllBlocksCleared says the engine dropped its whole prefix cache.
type AllBlocksCleared struct{}

func (BlockStored) eventType() string      { return "BlockStored" }
func (BlockRemoved) eventType() string     { return "BlockRemoved" }
func (AllBlocksCleared) eventType() string { return "AllBlocksCleared" }

// EventBatch is the payload of one message: the events of one engine step.
type EventBatch struct {
	TS               float64 // Unix seconds
	Events           []Event
	DataParallelRank *int
}

// Layout selects how events are encoded.
type Layout int

const (
	// LayoutMap encodes each event as a map with a "type" key (current vLLM).
	LayoutMap Layout = iota
	// LayoutArray encodes each event as ["Type", fields...] (older vLLM, msgspec array_like).
	LayoutArray
)

// Encode returns the msgpack payload of b.
func Encode(b EventBatch, layout Layout) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	if err := encodeBatch(enc, b, layout); err != nil {
		return nil, fmt.Errorf("encoding event batch: %w", err)
	}
	return buf.Bytes(), nil
}

func encodeBatch(e *msgpack.Encoder, b EventBatch, layout Layout) error {
	if err := e.EncodeArrayLen(3); err != nil {
		return err
	}
	if err := e.EncodeFloat64(b.TS); err != nil {
		return err
	}
	if err := e.EncodeArrayLen(len(b.Events)); err != nil {
		return err
	}
	for _, ev := range b.Events {
		if err := encodeEvent(e, ev, layout); err != nil {
			return err
		}
	}
	if b.DataParallelRank == nil {
		return e.EncodeNil()
	}
	return e.EncodeInt(int64(*b.DataParallelRank))
}

func encodeHash(e *msgpack.Encoder, h Hash) error {
	if h.isBytes {
		return e.EncodeBytes([]byte(h.b))
	}
	return e.EncodeUint(h.n)
}

func encodeHashes(e *msgpack.Encoder, hs []Hash) error {
	if err := e.EncodeArrayLen(len(hs)); err != nil {
		return err
	}
	for _, h := range hs {
		if err := encodeHash(e, h); err != nil {
			return err
		}
	}
	return nil
}

func encodeOptString(e *msgpack.Encoder, s string) error {
	if s == "" {
		return e.EncodeNil()
	}
	return e.EncodeString(s)
}

func encodeEvent(e *msgpack.Encoder, ev Event, layout Layout) error {
	type field struct {
		name string
		enc  func() error
	}
	var fields []field
	switch ev := ev.(type) {
	case BlockStored:
		fields = []field{
			{"block_hashes", func() error { return encodeHashes(e, ev.BlockHashes) }},
			{"parent_block_hash", func() error {
				if ev.ParentBlockHash == nil {
					return e.EncodeNil()
				}
				return encodeHash(e, *ev.ParentBlockHash)
			}},
			{"token_ids", func() error {
				if err := e.EncodeArrayLen(len(ev.TokenIDs)); err != nil {
					return err
				}
				for _, t := range ev.TokenIDs {
					if err := e.EncodeInt(int64(t)); err != nil {
						return err
					}
				}
				return nil
			}},
			{"block_size", func() error { return e.EncodeInt(int64(ev.BlockSize)) }},
			{"lora_id", func() error {
				if ev.LoraID == nil {
					return e.EncodeNil()
				}
				return e.EncodeInt(*ev.LoraID)
			}},
			{"medium", func() error { return encodeOptString(e, ev.Medium) }},
			{"lora_name", func() error { return encodeOptString(e, ev.LoraName) }},
		}
	case BlockRemoved:
		fields = []field{
			{"block_hashes", func() error { return encodeHashes(e, ev.BlockHashes) }},
			{"medium", func() error { return encodeOptString(e, ev.Medium) }},
		}
	case AllBlocksCleared:
	default:
		return fmt.Errorf("unknown event type %T", ev)
	}
	if layout == LayoutArray {
		if err := e.EncodeArrayLen(1 + len(fields)); err != nil {
			return err
		}
		if err := e.EncodeString(ev.eventType()); err != nil {
			return err
		}
		for _, f := range fields {
			if err := f.enc(); err != nil {
				return err
			}
		}
		return nil
	}
	if err := e.EncodeMapLen(1 + len(fields)); err != nil {
		return err
	}
	if err := e.EncodeString("type"); err != nil {
		return err
	}
	if err := e.EncodeString(ev.eventType()); err != nil {
		return err
	}
	for _, f := range fields {
		if err := e.EncodeString(f.name); err != nil {
			return err
		}
		if err := f.enc(); err != nil {
			return err
		}
	}
	return nil
}

// Decode parses a msgpack EventBatch payload. Unknown event types and unknown fields
// are skipped, so newer engines' additions do not break subscribers.
func Decode(payload []byte) (EventBatch, error) {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	b, err := decodeBatch(d)
	if err != nil {
		return EventBatch{}, fmt.Errorf("decoding event batch: %w", err)
	}
	return b, nil
}

func decodeBatch(d *msgpack.Decoder) (EventBatch, error) {
	var b EventBatch
	n, err := d.DecodeArrayLen()
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, fmt.Errorf("batch array has %d elements, want >= 2", n)
	}
	if b.TS, err = decodeNumber(d); err != nil {
		return b, fmt.Errorf("ts: %w", err)
	}
	ne, err := d.DecodeArrayLen()
	if err != nil {
		return b, fmt.Errorf("events: %w", err)
	}
	for i := 0; i < ne; i++ {
		ev, err := decodeEvent(d)
		if err != nil {
			return b, fmt.Errorf("event %d: %w", i, err)
		}
		if ev != nil {
			b.Events = append(b.Events, ev)
		}
	}
	if n >= 3 {
		isNil, err := peekNil(d)
		if err != nil {
			return b, err
		}
		if !isNil {
			r, err := d.DecodeInt()
			if err != nil {
				return b, fmt.Errorf("data_parallel_rank: %w", err)
			}
			b.DataParallelRank = &r
		}
	}
	for i := 3; i < n; i++ {
		if err := d.Skip(); err != nil {
			return b, err
		}
	}
	return b, nil
}

func decodeNumber(d *msgpack.Decoder) (float64, error) {
	c, err := d.PeekCode()
	if err != nil {
		return 0, err
	}
	if c == msgpcode.Float || c == msgpcode.Double {
		return d.DecodeFloat64()
	}
	v, err := d.DecodeInt64()
	return float64(v), err
}

func peekNil(d *msgpack.Decoder) (bool, error) {
	c, err := d.PeekCode()
	if err != nil {
		return false, err
	}
	if c == msgpcode.Nil {
		return true, d.DecodeNil()
	}
	return false, nil
}

func isMapCode(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// decodeEvent returns nil for an event type it does not know.
func decodeEvent(d *msgpack.Decoder) (Event, error) {
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	if isMapCode(c) {
		return decodeMapEvent(d)
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, fmt.Errorf("event is neither map nor array: %w", err)
	}
	if n < 1 {
		return nil, fmt.Errorf("empty event array")
	}
	typ, err := d.DecodeString()
	if err != nil {
		return nil, fmt.Errorf("event tag: %w", err)
	}
	names := fieldOrder[typ]
	var st eventState
	for i := 1; i < n; i++ {
		if i-1 < len(names) {
			if err := st.field(d, typ, names[i-1]); err != nil {
				return nil, err
			}
			continue
		}
		if err := d.Skip(); err != nil {
			return nil, err
		}
	}
	return st.event(typ), nil
}

var fieldOrder = map[string][]string{
	"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"},
	"BlockRemoved":     {"block_hashes", "medium"},
	"AllBlocksCleared": {},
}

func decodeMapEvent(d *msgpack.Decoder) (Event, error) {
	n, err := d.DecodeMapLen()
	if err != nil {
		return nil, err
	}
	// "type" is normally first, but a map has no order: keep raw values until it is known.
	var typ string
	pending := map[string]msgpack.RawMessage{}
	for i := 0; i < n; i++ {
		k, err := d.DecodeString()
		if err != nil {
			return nil, fmt.Errorf("event key: %w", err)
		}
		if k == "type" {
			if typ, err = d.DecodeString(); err != nil {
				return nil, fmt.Errorf("event type: %w", err)
			}
			continue
		}
		raw, err := d.DecodeRaw()
		if err != nil {
			return nil, fmt.Errorf("field %s: %w", k, err)
		}
		pending[k] = raw
	}
	if typ == "" {
		return nil, fmt.Errorf("event map has no type")
	}
	var st eventState
	for k, raw := range pending {
		if err := st.field(msgpack.NewDecoder(bytes.NewReader(raw)), typ, k); err != nil {
			return nil, err
		}
	}
	return st.event(typ), nil
}

type eventState struct {
	stored  BlockStored
	removed BlockRemoved
}

func (s *eventState) event(typ string) Event {
	switch typ {
	case "BlockStored":
		return s.stored
	case "BlockRemoved":
		return s.removed
	case "AllBlocksCleared":
		return AllBlocksCleared{}
	}
	return nil
}

func (s *eventState) field(d *msgpack.Decoder, typ, name string) error {
	var err error
	switch typ + "." + name {
	case "BlockStored.block_hashes":
		s.stored.BlockHashes, err = decodeHashes(d)
	case "BlockStored.parent_block_hash":
		var isNil bool
		if isNil, err = peekNil(d); err == nil && !isNil {
			var h Hash
			if h, err = decodeHash(d); err == nil {
				s.stored.ParentBlockHash = &h
			}
		}
	case "BlockStored.token_ids":
		var n int
		if n, err = d.DecodeArrayLen(); err == nil && n > 0 {
			// A length prefix is untrusted: grow as elements actually arrive.
			s.stored.TokenIDs = make([]int32, 0, min(n, maxPrealloc))
			for range n {
				var v int64
				if v, err = d.DecodeInt64(); err != nil {
					break
				}
				s.stored.TokenIDs = append(s.stored.TokenIDs, int32(v))
			}
		}
	case "BlockStored.block_size":
		s.stored.BlockSize, err = d.DecodeInt()
	case "BlockStored.lora_id":
		var isNil bool
		if isNil, err = peekNil(d); err == nil && !isNil {
			var v int64
			if v, err = d.DecodeInt64(); err == nil {
				s.stored.LoraID = &v
			}
		}
	case "BlockStored.medium":
		s.stored.Medium, err = decodeOptString(d)
	case "BlockStored.lora_name":
		s.stored.LoraName, err = decodeOptString(d)
	case "BlockRemoved.block_hashes":
		s.removed.BlockHashes, err = decodeHashes(d)
	case "BlockRemoved.medium":
		s.removed.Medium, err = decodeOptString(d)
	default:
		err = d.Skip()
	}
	if err != nil {
		return fmt.Errorf("%s.%s: %w", typ, name, err)
	}
	return nil
}

// maxPrealloc bounds allocations made from a length prefix before the elements are read.
const maxPrealloc = 4096

func decodeOptString(d *msgpack.Decoder) (string, error) {
	isNil, err := peekNil(d)
	if err != nil || isNil {
		return "", err
	}
	return d.DecodeString()
}

func decodeHashes(d *msgpack.Decoder) ([]Hash, error) {
	n, err := d.DecodeArrayLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	hs := make([]Hash, 0, min(n, maxPrealloc))
	for range n {
		h, err := decodeHash(d)
		if err != nil {
			return nil, err
		}
		hs = append(hs, h)
	}
	return hs, nil
}

func decodeHash(d *msgpack.Decoder) (Hash, error) {
	c, err := d.PeekCode()
	if err != nil {
		return Hash{}, err
	}
	switch {
	case msgpcode.IsBin(c) || msgpcode.IsString(c):
		b, err := d.DecodeBytes()
		return HashBytes(b), err
	case c == msgpcode.Uint64 || c == msgpcode.Uint32 || c == msgpcode.Uint16 || c == msgpcode.Uint8 || msgpcode.IsFixedNum(c) && c <= msgpcode.PosFixedNumHigh:
		v, err := d.DecodeUint64()
		return HashUint64(v), err
	default:
		// Negative Python hash(): keep its two's-complement bits.
		v, err := d.DecodeInt64()
		return HashUint64(uint64(v)), err
	}
}
