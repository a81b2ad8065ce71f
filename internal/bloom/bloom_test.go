package bloom

import (
	"bytes"
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
