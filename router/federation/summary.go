package federation

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/internal/bloom"
)

// Summary is what one router tells the others every second about its
// datacenter: per model, its load and capacity and a filter of the prefix
// blocks it served recently.
type Summary struct {
	DC     string
	At     time.Time // when the sender built it (its clock; only logged)
	Models []ModelSummary
}

// ModelSummary is one model's figures in a Summary.
type ModelSummary struct {
	Model     string
	InFlight  uint32
	Queued    uint32
	Free      uint32        // admission slots free now; FreeUnlimited when uncapped
	TTFT      time.Duration // estimated time to first token of an uncached prompt, queue excluded
	QueueWait time.Duration // estimated admission wait
	// Prefixes holds the block keys of recently served prompts (nil: none).
	Prefixes *bloom.Filter
}

// FreeUnlimited is Free for a model without an in-flight cap.
const FreeUnlimited = 1<<32 - 1

// Decoding limits: a summary comes from another datacenter and is untrusted
// even when its sender is authenticated.
const (
	MaxSummaryBytes = 1 << 20
	MaxModels       = 256
	maxNameLen      = 128
	maxFilterBytes  = 64 << 10
	maxDuration     = time.Hour
)

var summaryMagic = [4]byte{'O', 'F', 'S', '1'}

// ErrBadSummary is a summary that does not decode.
var ErrBadSummary = errors.New("federation: malformed summary")

// MarshalBinary encodes s:
//
//	"OFS1" | dc (u8 len, bytes) | at unix ms (uvarint) | models (uvarint)
//	per model: name (u8 len, bytes) | in_flight | queued | free |
//	           ttft µs | queue_wait µs (uvarints) | filter (uvarint len, bloom wire form)
func (s *Summary) MarshalBinary() ([]byte, error) {
	if len(s.Models) > MaxModels {
		return nil, fmt.Errorf("federation: %d models exceed %d", len(s.Models), MaxModels)
	}
	b := append(make([]byte, 0, 64+len(s.Models)*64), summaryMagic[:]...)
	b = appendName(b, s.DC)
	b = binary.AppendUvarint(b, uint64(max(s.At.UnixMilli(), 0)))
	b = binary.AppendUvarint(b, uint64(len(s.Models)))
	for _, m := range s.Models {
		b = appendName(b, m.Model)
		for _, v := range []uint64{uint64(m.InFlight), uint64(m.Queued), uint64(m.Free),
			uint64(clampDuration(m.TTFT) / time.Microsecond), uint64(clampDuration(m.QueueWait) / time.Microsecond)} {
			b = binary.AppendUvarint(b, v)
		}
		var f []byte
		if m.Prefixes != nil {
			f = m.Prefixes.Marshal()
		}
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	if len(b) > MaxSummaryBytes {
		return nil, fmt.Errorf("federation: summary of %d bytes exceeds %d", len(b), MaxSummaryBytes)
	}
	return b, nil
}

func clampDuration(d time.Duration) time.Duration { return min(max(d, 0), maxDuration) }

func appendName(b []byte, s string) []byte {
	if len(s) > maxNameLen {
		s = s[:maxNameLen] // the decoder refuses longer: validName makes it unreachable
	}
	return append(append(b, byte(len(s))), s...)
}

// UnmarshalBinary decodes an untrusted summary. Names must pass validName;
// filters share b.
func (s *Summary) UnmarshalBinary(b []byte) error {
	d := decoder{b: b}
	if len(b) > MaxSummaryBytes || !d.magic() {
		return ErrBadSummary
	}
	dc := d.name()
	at := d.uvarint(1 << 50)
	n := d.uvarint(MaxModels)
	out := Summary{DC: dc, At: time.UnixMilli(int64(at)), Models: make([]ModelSummary, 0, min(n, 16))}
	seen := make(map[string]bool, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		m := ModelSummary{Model: d.name()}
		if seen[m.Model] {
			d.fail("model %q twice", m.Model)
		}
		seen[m.Model] = true
		m.InFlight = uint32(d.uvarint(FreeUnlimited))
		m.Queued = uint32(d.uvarint(FreeUnlimited))
		m.Free = uint32(d.uvarint(FreeUnlimited))
		m.TTFT = time.Duration(d.uvarint(uint64(maxDuration/time.Microsecond))) * time.Microsecond
		m.QueueWait = time.Duration(d.uvarint(uint64(maxDuration/time.Microsecond))) * time.Microsecond
		if fl := d.uvarint(maxFilterBytes); fl > 0 && d.err == nil {
			f, err := bloom.Unmarshal(d.bytes(int(fl)))
			if err != nil && d.err == nil {
				d.fail("model %q: %v", m.Model, err)
			}
			m.Prefixes = f
		}
		out.Models = append(out.Models, m)
	}
	if d.err == nil && len(d.b) != d.off {
		d.fail("%d bytes after the summary", len(d.b)-d.off)
	}
	if d.err != nil {
		return d.err
	}
	*s = out
	return nil
}

// decoder reads a summary, keeping the first error.
type decoder struct {
	b   []byte
	off int
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrBadSummary, fmt.Sprintf(format, args...))
	}
}

func (d *decoder) magic() bool {
	if len(d.b) < 4 || [4]byte(d.b[:4]) != summaryMagic {
		return false
	}
	d.off = 4
	return true
}

func (d *decoder) bytes(n int) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || n > len(d.b)-d.off {
		d.fail("truncated")
		return nil
	}
	p := d.b[d.off : d.off+n : d.off+n]
	d.off += n
	return p
}

func (d *decoder) uvarint(limit uint64) uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b[d.off:])
	// An overlong encoding (a last byte of 0) is refused: one summary has
	// one encoding.
	if n <= 0 || v > limit || n > 1 && d.b[d.off+n-1] == 0 {
		d.fail("bad number at byte %d", d.off)
		return 0
	}
	d.off += n
	return v
}

func (d *decoder) name() string {
	l := d.bytes(1)
	if l == nil {
		return ""
	}
	s := string(d.bytes(int(l[0])))
	if d.err == nil && !validName(s) {
		d.fail("invalid name %q", s)
	}
	return s
}

// validName accepts datacenter and model names: 1 to 128 bytes of letters,
// digits and ._-:/@ (what Consul datacenters and model ids use).
func validName(s string) bool {
	if len(s) == 0 || len(s) > maxNameLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '.' || c == '_' || c == '-' || c == ':' || c == '/' || c == '@') {
			return false
		}
	}
	return true
}

// PrefixKey is the filter key of one prompt block key (scoring's prefix keys).
func PrefixKey(k uint64) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], k)
	return string(b[:])
}

// CachedBlocks counts the leading keys the filter may hold: the prefix a
// remote datacenter may have cached.
func CachedBlocks(f *bloom.Filter, keys []uint64) int {
	n := 0
	for _, k := range keys {
		if !f.MayHave(PrefixKey(k)) {
			break
		}
		n++
	}
	return n
}
