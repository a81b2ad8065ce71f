package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
)

// Decode parses a msgpack EventBatch payload. Unknown event types and unknown fields
// are skipped, so newer engines' additions do not break subscribers. The batch owns
// its memory; events are values (BlockStored, BlockRemoved, AllBlocksCleared).
func Decode(payload []byte) (EventBatch, error) {
	d := Decoder{values: true}
	return d.Decode(payload)
}

// Decoder parses EventBatch payloads on an ingest hot path: a hand-written msgpack
// reader (no reflection, no intermediate values) that reuses its buffers from one
// batch to the next. The batch it returns, and every slice and pointer in it, is only
// valid until the next call to Decode. Its events are *BlockStored, *BlockRemoved and
// AllBlocksCleared. A Decoder is not safe for concurrent use; the zero value is ready.
type Decoder struct {
	values bool // events as values, for Decode

	events  []Event
	stored  []BlockStored
	removed []BlockRemoved
	hashes  []Hash
	tokens  []int32
	parents []Hash
	loraIDs []int64
}

// Decode parses one payload; see Decoder.
func (d *Decoder) Decode(payload []byte) (EventBatch, error) {
	d.events, d.stored, d.removed = d.events[:0], d.stored[:0], d.removed[:0]
	d.hashes, d.tokens, d.parents, d.loraIDs = d.hashes[:0], d.tokens[:0], d.parents[:0], d.loraIDs[:0]
	r := reader{b: payload}
	b, err := d.batch(&r)
	if err != nil {
		return EventBatch{}, fmt.Errorf("decoding event batch: %w", err)
	}
	return b, nil
}

func (d *Decoder) batch(r *reader) (EventBatch, error) {
	var b EventBatch
	n, err := r.arrayLen()
	if err != nil {
		return b, err
	}
	if n < 2 {
		return b, fmt.Errorf("batch array has %d elements, want >= 2", n)
	}
	if b.TS, err = r.number(); err != nil {
		return b, fmt.Errorf("ts: %w", err)
	}
	ne, err := r.arrayLen()
	if err != nil {
		return b, fmt.Errorf("events: %w", err)
	}
	if d.values {
		d.events = make([]Event, 0, ne)
	}
	for i := 0; i < ne; i++ {
		ev, err := d.event(r)
		if err != nil {
			return b, fmt.Errorf("event %d: %w", i, err)
		}
		if ev != nil {
			d.events = append(d.events, ev)
		}
	}
	if len(d.events) > 0 {
		b.Events = d.events[:len(d.events):len(d.events)]
	}
	if n >= 3 {
		if !r.nilNext() {
			v, err := r.int64()
			if err != nil {
				return b, fmt.Errorf("data_parallel_rank: %w", err)
			}
			rank := int(v)
			b.DataParallelRank = &rank
		}
	}
	for i := 3; i < n; i++ {
		if err := r.skip(0); err != nil {
			return b, err
		}
	}
	return b, nil
}

// Event field names in array-layout order (msgspec array_like).
var (
	storedFields  = [...]string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
	removedFields = [...]string{"block_hashes", "medium"}
)

const (
	typeUnknown = iota
	typeStored
	typeRemoved
	typeCleared
)

func eventTypeOf(name []byte) int {
	switch string(name) {
	case "BlockStored":
		return typeStored
	case "BlockRemoved":
		return typeRemoved
	case "AllBlocksCleared":
		return typeCleared
	}
	return typeUnknown
}

// builder collects one event's fields.
type builder struct {
	typ     int
	stored  BlockStored
	removed BlockRemoved
}

// event returns nil for an event type it does not know.
func (d *Decoder) event(r *reader) (Event, error) {
	c, err := r.peek()
	if err != nil {
		return nil, err
	}
	var bl builder
	if isMap(c) {
		err = d.mapEvent(r, &bl)
	} else {
		err = d.arrayEvent(r, &bl)
	}
	if err != nil {
		return nil, err
	}
	return d.finish(&bl), nil
}

func (d *Decoder) arrayEvent(r *reader, bl *builder) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("event is neither map nor array: %w", err)
	}
	if n < 1 {
		return errors.New("empty event array")
	}
	tag, err := r.str()
	if err != nil {
		return fmt.Errorf("event tag: %w", err)
	}
	bl.typ = eventTypeOf(tag)
	var names []string
	switch bl.typ {
	case typeStored:
		names = storedFields[:]
	case typeRemoved:
		names = removedFields[:]
	}
	for i := 1; i < n; i++ {
		if i-1 < len(names) {
			if err := d.field(r, bl, names[i-1]); err != nil {
				return err
			}
			continue
		}
		if err := r.skip(0); err != nil {
			return err
		}
	}
	return nil
}

func (d *Decoder) mapEvent(r *reader, bl *builder) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	// "type" is normally the first key, and then fields decode in place; a map has no
	// order, though, so fields seen before it are remembered and decoded after.
	type pending struct {
		name string
		off  int
	}
	var early [len(storedFields)]pending
	ne, typed := 0, false
	for i := 0; i < n; i++ {
		k, err := r.str()
		if err != nil {
			return fmt.Errorf("event key: %w", err)
		}
		if string(k) == "type" {
			tag, err := r.str()
			if err != nil {
				return fmt.Errorf("event type: %w", err)
			}
			bl.typ, typed = eventTypeOf(tag), true
			continue
		}
		if typed {
			if err := d.field(r, bl, fieldName(k)); err != nil {
				return err
			}
			continue
		}
		if name := fieldName(k); name != "" && ne < len(early) {
			early[ne] = pending{name, r.off}
			ne++
		}
		if err := r.skip(0); err != nil {
			return fmt.Errorf("field %s: %w", k, err)
		}
	}
	if !typed {
		return errors.New("event map has no type")
	}
	for _, p := range early[:ne] {
		sub := reader{b: r.b, off: p.off}
		if err := d.field(&sub, bl, p.name); err != nil {
			return err
		}
	}
	return nil
}

// fieldName returns the canonical name of a known field key, "" otherwise.
func fieldName(k []byte) string {
	for _, f := range storedFields {
		if string(k) == f {
			return f
		}
	}
	return ""
}

func (d *Decoder) field(r *reader, bl *builder, name string) error {
	var err error
	switch bl.typ {
	case typeStored:
		err = d.storedField(r, &bl.stored, name)
	case typeRemoved:
		switch name {
		case "block_hashes":
			bl.removed.BlockHashes, err = d.hashList(r)
		case "medium":
			bl.removed.Medium, err = r.optString()
		default:
			err = r.skip(0)
		}
	default:
		err = r.skip(0)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

func (d *Decoder) storedField(r *reader, st *BlockStored, name string) error {
	var err error
	switch name {
	case "block_hashes":
		st.BlockHashes, err = d.hashList(r)
	case "parent_block_hash":
		if !r.nilNext() {
			var h Hash
			if h, err = r.hash(); err == nil {
				if d.values {
					st.ParentBlockHash = &h
				} else {
					d.parents = append(d.parents, h)
					st.ParentBlockHash = &d.parents[len(d.parents)-1]
				}
			}
		}
	case "token_ids":
		st.TokenIDs, err = d.tokenList(r)
	case "block_size":
		var v int64
		v, err = r.int64()
		st.BlockSize = int(v)
	case "lora_id":
		if !r.nilNext() {
			var v int64
			if v, err = r.int64(); err == nil {
				d.loraIDs = append(d.loraIDs, v)
				st.LoraID = &d.loraIDs[len(d.loraIDs)-1]
			}
		}
	case "medium":
		st.Medium, err = r.optString()
	case "lora_name":
		st.LoraName, err = r.optString()
	default:
		err = r.skip(0)
	}
	return err
}

func (d *Decoder) finish(bl *builder) Event {
	switch bl.typ {
	case typeStored:
		if d.values {
			return bl.stored
		}
		d.stored = append(d.stored, bl.stored)
		return &d.stored[len(d.stored)-1]
	case typeRemoved:
		if d.values {
			return bl.removed
		}
		d.removed = append(d.removed, bl.removed)
		return &d.removed[len(d.removed)-1]
	case typeCleared:
		return AllBlocksCleared{}
	}
	return nil
}

func (d *Decoder) hashList(r *reader) ([]Hash, error) {
	n, err := r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	if d.values {
		// A batch that owns its memory: one exact allocation, no arena.
		hs := make([]Hash, n)
		for i := range hs {
			if hs[i], err = r.hash(); err != nil {
				return nil, err
			}
		}
		return hs, nil
	}
	start := len(d.hashes)
	for range n {
		h, err := r.hash()
		if err != nil {
			return nil, err
		}
		d.hashes = append(d.hashes, h)
	}
	return d.hashes[start:len(d.hashes):len(d.hashes)], nil
}

func (d *Decoder) tokenList(r *reader) ([]int32, error) {
	n, err := r.arrayLen()
	if err != nil || n == 0 {
		return nil, err
	}
	if d.values {
		return r.int32s(make([]int32, 0, n), n)
	}
	start := len(d.tokens)
	d.tokens, err = r.int32s(growInt32(d.tokens, n), n)
	if err != nil {
		return nil, err
	}
	return d.tokens[start:len(d.tokens):len(d.tokens)], nil
}

func growInt32(s []int32, n int) []int32 {
	if cap(s)-len(s) >= n {
		return s
	}
	out := make([]int32, len(s), 2*cap(s)+n)
	copy(out, s)
	return out
}

// reader is a msgpack reader over one payload. Length prefixes are checked against
// the bytes left (every element takes at least one byte), so a forged prefix fails
// instead of allocating.
type reader struct {
	b   []byte
	off int
}

var errShort = errors.New("unexpected end of payload")

// maxDepth bounds nesting in skipped values.
const maxDepth = 32

func isMap(c byte) bool { return c&0xf0 == 0x80 || c == 0xde || c == 0xdf }

func (r *reader) peek() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	return r.b[r.off], nil
}

func (r *reader) next(n int) ([]byte, error) {
	if n < 0 || len(r.b)-r.off < n {
		return nil, errShort
	}
	p := r.b[r.off : r.off+n]
	r.off += n
	return p, nil
}

func (r *reader) u8() (byte, error) {
	if r.off >= len(r.b) {
		return 0, errShort
	}
	c := r.b[r.off]
	r.off++
	return c, nil
}

// length reads a 1-, 2- or 4-byte big-endian length.
func (r *reader) length(size int) (int, error) {
	p, err := r.next(size)
	if err != nil {
		return 0, err
	}
	switch size {
	case 1:
		return int(p[0]), nil
	case 2:
		return int(binary.BigEndian.Uint16(p)), nil
	}
	return int(binary.BigEndian.Uint32(p)), nil
}

// count checks that n elements of at least one byte each can follow.
func (r *reader) count(n int, err error) (int, error) {
	if err != nil {
		return 0, err
	}
	if n > len(r.b)-r.off {
		return 0, fmt.Errorf("length %d exceeds the %d bytes left", n, len(r.b)-r.off)
	}
	return n, nil
}

func (r *reader) arrayLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	switch {
	case c&0xf0 == 0x90:
		return r.count(int(c&0x0f), nil)
	case c == 0xdc:
		return r.count(r.length(2))
	case c == 0xdd:
		return r.count(r.length(4))
	case c == 0xc0: // nil: an empty array
		return 0, nil
	}
	return 0, fmt.Errorf("want an array, got code %#x", c)
}

func (r *reader) mapLen() (int, error) {
	c, err := r.u8()
	if err != nil {
		return 0, err
	}
	switch {
	case c&0xf0 == 0x80:
		return r.count(int(c&0x0f), nil)
	case c == 0xde:
		return r.count(r.length(2))
	case c == 0xdf:
		return r.count(r.length(4))
	}
	return 0, fmt.Errorf("want a map, got code %#x", c)
}

// nilNext consumes a nil and reports whether there was one.
func (r *reader) nilNext() bool {
	if r.off < len(r.b) && r.b[r.off] == 0xc0 {
		r.off++
		return true
	}
	return false
}

// str reads a str or bin as bytes aliasing the payload; nil reads as empty.
func (r *reader) str() ([]byte, error) {
	c, err := r.u8()
	if err != nil {
		return nil, err
	}
	var n int
	switch {
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xd9 || c == 0xc4:
		n, err = r.length(1)
	case c == 0xda || c == 0xc5:
		n, err = r.length(2)
	case c == 0xdb || c == 0xc6:
		n, err = r.length(4)
	case c == 0xc0:
		return nil, nil
	default:
		return nil, fmt.Errorf("want a string, got code %#x", c)
	}
	if err != nil {
		return nil, err
	}
	return r.next(n)
}

func (r *reader) optString() (string, error) {
	b, err := r.str()
	return string(b), err
}

// uint reads any msgpack integer as its 64 bits (two's complement for negatives).
func (r *reader) intBits() (uint64, bool, error) {
	c, err := r.u8()
	if err != nil {
		return 0, false, err
	}
	if c <= 0x7f {
		return uint64(c), false, nil
	}
	if c >= 0xe0 {
		return uint64(int64(int8(c))), true, nil
	}
	var size int
	switch c {
	case 0xcc, 0xd0:
		size = 1
	case 0xcd, 0xd1:
		size = 2
	case 0xce, 0xd2:
		size = 4
	case 0xcf, 0xd3:
		size = 8
	default:
		return 0, false, fmt.Errorf("want an integer, got code %#x", c)
	}
	p, err := r.next(size)
	if err != nil {
		return 0, false, err
	}
	signed := c >= 0xd0
	switch size {
	case 1:
		if signed {
			return uint64(int64(int8(p[0]))), true, nil
		}
		return uint64(p[0]), false, nil
	case 2:
		v := binary.BigEndian.Uint16(p)
		if signed {
			return uint64(int64(int16(v))), true, nil
		}
		return uint64(v), false, nil
	case 4:
		v := binary.BigEndian.Uint32(p)
		if signed {
			return uint64(int64(int32(v))), true, nil
		}
		return uint64(v), false, nil
	}
	return binary.BigEndian.Uint64(p), signed, nil
}

// int32s appends n integers to dst, truncated to int32 as token ids are. Token
// ids are non-negative and below 2^32, so the codes for those are read inline.
func (r *reader) int32s(dst []int32, n int) ([]int32, error) {
	b := r.b
	for range n {
		if off := r.off; off < len(b) {
			switch c := b[off]; {
			case c <= 0x7f:
				dst = append(dst, int32(c))
				r.off++
				continue
			case c == 0xcd && off+3 <= len(b):
				dst = append(dst, int32(binary.BigEndian.Uint16(b[off+1:])))
				r.off += 3
				continue
			case c == 0xce && off+5 <= len(b):
				dst = append(dst, int32(binary.BigEndian.Uint32(b[off+1:])))
				r.off += 5
				continue
			}
		}
		v, err := r.int64()
		if err != nil {
			return nil, err
		}
		dst = append(dst, int32(v))
	}
	return dst, nil
}

func (r *reader) int64() (int64, error) {
	v, signed, err := r.intBits()
	if err != nil {
		return 0, err
	}
	if !signed && v > math.MaxInt64 {
		return 0, fmt.Errorf("integer %d overflows int64", v)
	}
	return int64(v), nil
}

// number reads a float or an integer.
func (r *reader) number() (float64, error) {
	c, err := r.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xca:
		r.off++
		p, err := r.next(4)
		if err != nil {
			return 0, err
		}
		return float64(math.Float32frombits(binary.BigEndian.Uint32(p))), nil
	case 0xcb:
		r.off++
		p, err := r.next(8)
		if err != nil {
			return 0, err
		}
		return math.Float64frombits(binary.BigEndian.Uint64(p)), nil
	}
	v, err := r.int64()
	return float64(v), err
}

// hash reads a block hash: an integer (a negative Python hash() keeps its
// two's-complement bits) or a byte string.
func (r *reader) hash() (Hash, error) {
	c, err := r.peek()
	if err != nil {
		return Hash{}, err
	}
	if c&0xe0 == 0xa0 || (c >= 0xc4 && c <= 0xc6) || (c >= 0xd9 && c <= 0xdb) {
		b, err := r.str()
		return HashBytes(b), err
	}
	v, _, err := r.intBits()
	return HashUint64(v), err
}

// skip passes over one value of any type.
func (r *reader) skip(depth int) error {
	if depth > maxDepth {
		return errors.New("values nested too deep")
	}
	c, err := r.u8()
	if err != nil {
		return err
	}
	var n int
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return nil
	case c&0xf0 == 0x80:
		return r.skipN(2*int(c&0x0f), depth)
	case c&0xf0 == 0x90:
		return r.skipN(int(c&0x0f), depth)
	case c&0xe0 == 0xa0:
		n = int(c & 0x1f)
	case c == 0xcc || c == 0xd0:
		n = 1
	case c == 0xcd || c == 0xd1:
		n = 2
	case c == 0xce || c == 0xd2 || c == 0xca:
		n = 4
	case c == 0xcf || c == 0xd3 || c == 0xcb:
		n = 8
	case c == 0xd9 || c == 0xc4:
		n, err = r.length(1)
	case c == 0xda || c == 0xc5:
		n, err = r.length(2)
	case c == 0xdb || c == 0xc6:
		n, err = r.length(4)
	case c == 0xdc:
		if n, err = r.count(r.length(2)); err != nil {
			return err
		}
		return r.skipN(n, depth)
	case c == 0xdd:
		if n, err = r.count(r.length(4)); err != nil {
			return err
		}
		return r.skipN(n, depth)
	case c == 0xde:
		if n, err = r.count(r.length(2)); err != nil {
			return err
		}
		return r.skipN(2*n, depth)
	case c == 0xdf:
		if n, err = r.count(r.length(4)); err != nil {
			return err
		}
		return r.skipN(2*n, depth)
	case c >= 0xd4 && c <= 0xd8: // fixext 1, 2, 4, 8, 16: type byte + data
		n = 1 + 1<<(c-0xd4)
	case c == 0xc7:
		if n, err = r.length(1); err == nil {
			n++
		}
	case c == 0xc8:
		if n, err = r.length(2); err == nil {
			n++
		}
	case c == 0xc9:
		if n, err = r.length(4); err == nil {
			n++
		}
	default:
		return fmt.Errorf("invalid code %#x", c)
	}
	if err != nil {
		return err
	}
	_, err = r.next(n)
	return err
}

func (r *reader) skipN(n, depth int) error {
	for range n {
		if err := r.skip(depth + 1); err != nil {
			return err
		}
	}
	return nil
}
