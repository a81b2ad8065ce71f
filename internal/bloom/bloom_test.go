package bloom

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/shoenig/test/must"
)

func TestFalsePositiveRate(t *testing.T) {
	f := New(10000)
	for i := 0; i < 10000; i++ {
		f.Add(fmt.Sprintf("model@1@0@%x@bfloat16kv_bytes", i))
	}
	for i := 0; i < 10000; i++ {
		must.True(t, f.MayHave(fmt.Sprintf("model@1@0@%x@bfloat16kv_bytes", i)))
	}
	fp := 0
	for i := 0; i < 100000; i++ {
		if f.MayHave(fmt.Sprintf("other@%d", i)) {
			fp++
		}
	}
	must.Less(t, 2000, fp) // < 2%
	g, err := Unmarshal(f.Marshal())
	must.NoError(t, err)
	must.True(t, g.MayHave("model@1@0@0@bfloat16kv_bytes"))
	_, err = Unmarshal([]byte{7, 1, 0, 0, 0})
	must.ErrorIs(t, err, ErrMalformed)
}

// FuzzUnmarshal feeds arbitrary filters, as a peer sends them, to Unmarshal.
// An accepted filter answers MayHave without panicking (its bit count and
// length agree), marshals back to the same bytes, and has no false negatives
// once a key is added to it.
func FuzzUnmarshal(f *testing.F) {
	g := New(100)
	g.Add("blk")
	f.Add(g.Marshal(), "blk")
	f.Add(New(0).Marshal(), "")
	f.Add([]byte{7, 1, 0, 0, 0}, "x")
	f.Add([]byte{7, 0, 0, 0, 0}, "x")
	f.Add([]byte{33, 8, 0, 0, 0, 0xff}, "x")
	f.Add([]byte{1, 0xf8, 0xff, 0xff, 0xff}, "x")
	f.Fuzz(func(t *testing.T, b []byte, key string) {
		bl, err := Unmarshal(b)
		if err != nil {
			return
		}
		if !bytes.Equal(bl.Marshal(), b) {
			t.Fatalf("Marshal(Unmarshal(%x)) = %x", b, bl.Marshal())
		}
		bl.MayHave(key)
		if bl.m == 0 {
			return // an empty filter has no bit to set: it holds nothing
		}
		bl.Add(key)
		if !bl.MayHave(key) {
			t.Fatalf("filter misses %q just added", key)
		}
	})
}

// Check passes what New makes and refuses filters that would match nearly
// anything: all ones, too small, odd k, nearly full.
func TestCheckRefusesFullAndOddFilters(t *testing.T) {
	for _, n := range []int{1, 64, 1024, 4096} {
		f := New(n)
		for i := 0; i < n; i++ {
			f.Add(fmt.Sprint("key", i))
		}
		must.NoError(t, f.Check(DefaultLimits()), must.Sprintf("New(%d) holding %d keys", n, n))
	}
	ones := func(k uint8, m uint32) *Filter {
		b := append([]byte{k, 0, 0, 0, 0}, bytes.Repeat([]byte{0xff}, int(m/8))...)
		b[1], b[2], b[3], b[4] = byte(m), byte(m>>8), byte(m>>16), byte(m>>24)
		f, err := Unmarshal(b)
		must.NoError(t, err)
		return f
	}
	overfull := New(64)
	for i := 0; i < 640; i++ {
		overfull.Add(fmt.Sprint("key", i))
	}
	for name, tc := range map[string]struct {
		f     *Filter
		field string
	}{
		"one byte of ones":      {ones(7, 8), "bits"},
		"all ones":              {ones(7, 640), "fill"},
		"one hash":              {ones(1, 640), "fill"},
		"too many hashes":       {&Filter{k: 32, m: 640, bits: make([]byte, 80)}, "k"},
		"ten times its keys":    {overfull, "fill"},
		"larger than any New's": {&Filter{k: 7, m: 1 << 24, bits: make([]byte, 1<<21)}, "bits"},
	} {
		t.Run(name, func(t *testing.T) {
			err := tc.f.Check(DefaultLimits())
			var le *LimitError
			must.True(t, errors.As(err, &le), must.Sprint(err))
			must.EqOp(t, tc.field, le.Field)
		})
	}
}
