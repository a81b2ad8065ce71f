package federation

import (
	"bytes"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/bloom"
)

func sampleSummary(keys int) *Summary {
	h := &HotKeys{keys: make([]uint64, max(keys, 1))}
	r := rand.New(rand.NewPCG(1, 2))
	for range keys {
		h.Add([]uint64{r.Uint64()})
	}
	return &Summary{DC: "dc1", At: time.UnixMilli(1_764_000_000_000), Models: []ModelSummary{
		{Model: "llama-3-8b", InFlight: 12, Queued: 3, Free: 52, TTFT: 180 * time.Millisecond,
			QueueWait: 40 * time.Millisecond, Prefixes: h.Filter()},
		{Model: "qwen/qwen3-32b", Free: FreeUnlimited},
	}}
}

func TestSummaryRoundTrip(t *testing.T) {
	s := sampleSummary(1024)
	b, err := s.MarshalBinary()
	must.NoError(t, err)
	var got Summary
	must.NoError(t, got.UnmarshalBinary(b))
	must.Eq(t, s.DC, got.DC)
	must.True(t, s.At.Equal(got.At))
	must.Len(t, 2, got.Models)
	for i, m := range got.Models {
		want := s.Models[i]
		must.Eq(t, want.Model, m.Model)
		must.Eq(t, [3]uint32{want.InFlight, want.Queued, want.Free}, [3]uint32{m.InFlight, m.Queued, m.Free})
		must.Eq(t, want.TTFT, m.TTFT)
		must.Eq(t, want.QueueWait, m.QueueWait)
	}
	must.Nil(t, got.Models[1].Prefixes)
	must.True(t, bytes.Equal(s.Models[0].Prefixes.Marshal(), got.Models[0].Prefixes.Marshal()))
}

// TestSummarySize reports the encoded size of one model's entry for the
// hot-key counts a router may be configured with.
func TestSummarySize(t *testing.T) {
	empty, err := (&Summary{DC: "dc1", At: time.Now()}).MarshalBinary()
	must.NoError(t, err)
	for _, keys := range []int{0, 256, 1024, 4096} {
		s := sampleSummary(keys)
		s.Models = s.Models[:1]
		b, err := s.MarshalBinary()
		must.NoError(t, err)
		per := len(b) - len(empty)
		t.Logf("hot keys %5d: %6d bytes per model", keys, per)
		must.Less(t, 64+keys*10/8+64, per) // the filter's 10 bits per key and a few varints
	}
}

func TestSummaryRejects(t *testing.T) {
	good, err := sampleSummary(16).MarshalBinary()
	must.NoError(t, err)
	badName, _ := (&Summary{DC: "dc 1"}).MarshalBinary()
	dup, _ := (&Summary{DC: "dc1", Models: []ModelSummary{{Model: "a"}, {Model: "a"}}}).MarshalBinary()
	for name, b := range map[string][]byte{
		"empty":          nil,
		"bad magic":      append([]byte("XFS1"), good[4:]...),
		"truncated":      good[:len(good)-1],
		"trailing bytes": append(append([]byte{}, good...), 0),
		"bad dc name":    badName,
		"model twice":    dup,
		"too large":      make([]byte, MaxSummaryBytes+1),
	} {
		t.Run(name, func(t *testing.T) {
			var s Summary
			must.ErrorIs(t, s.UnmarshalBinary(b), ErrBadSummary)
		})
	}
}

// FuzzSummary feeds arbitrary bytes, as a peer sends them, to the decoder.
// Whatever it accepts re-encodes to the same bytes (one encoding per
// summary, so no two peers' views differ) and decodes again.
func FuzzSummary(f *testing.F) {
	for _, s := range []*Summary{sampleSummary(64), {DC: "dc2"}, {DC: "d", Models: []ModelSummary{{Model: "m", Free: 1}}}} {
		b, err := s.MarshalBinary()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("OFS1\x01a\x00\x01\x01m\x00\x00\x00\x00\x00\x06\x01\x08\x00\x00\x00\xff"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Summary
		if err := s.UnmarshalBinary(b); err != nil {
			return
		}
		out, err := s.MarshalBinary()
		if err != nil {
			t.Fatalf("accepted summary does not encode: %v", err)
		}
		if !bytes.Equal(out, b) {
			t.Fatalf("re-encoded %x, got %x", b, out)
		}
		for _, m := range s.Models {
			m.Prefixes.MayHave("x")
		}
	})
}

func TestCachedBlocks(t *testing.T) {
	f := bloom.New(16)
	for _, k := range []uint64{1, 2, 3} {
		f.Add(PrefixKey(k))
	}
	must.Eq(t, 3, CachedBlocks(f, []uint64{1, 2, 3, 4}))
	must.Eq(t, 0, CachedBlocks(f, []uint64{9, 1, 2}))
	must.Eq(t, 0, CachedBlocks(nil, []uint64{1}))
}
