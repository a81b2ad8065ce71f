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
// Decoding is a hand-written msgpack reader (no reflection); a Decoder reuses its
// buffers across batches for ingest paths that consume each batch before the next.
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
)

// Storage media vLLM names in events, and DISK, which oasis-kvcached uses for
// its SSD tier (and oasis-sim for the tier that models it).
const (
	MediumGPU     = "GPU"
	MediumCPU     = "CPU"
	MediumStorage = "STORAGE"
	MediumDisk    = "DISK"
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
