package gateway

import (
	"bufio"
	"bytes"
	"io"
	"net/http/httputil"
	"testing"
)

// FuzzChunkDecoder checks the in-place chunk decoder against net/http's on
// the same bytes, fed in pieces split where the fuzzer says: whatever it
// accepts, net/http decodes to the same data; a body it finds complete ends
// where the final CRLF is.
func FuzzChunkDecoder(f *testing.F) {
	for _, s := range []string{
		"5\r\nhello\r\n0\r\n\r\n",
		"1a\r\ndata: {\"i\":0}\n\n\n\n\n\n\n\n\n\n\r\n0\r\n\r\nNEXT",
		"3;ext=1\r\nabc\r\n0\r\nX-Trailer: 1\r\n\r\n",
		"A\r\n0123456789\r\n2\r\nab\r\n0\r\n\r\n",
		"5\r\nhel",
		"5\nhello\r\n0\r\n\r\n",
		"fffffffffffffffff\r\n",
	} {
		f.Add([]byte(s), uint8(3), uint8(7))
	}
	f.Fuzz(func(t *testing.T, in []byte, s1, s2 uint8) {
		var d chunkDecoder
		var data []byte
		var derr error
		done := false
		consumed := 0
		// Feed in up to three pieces, each decoded in a copy of its own.
		cuts := []int{min(int(s1), len(in)), min(int(s1)+int(s2), len(in)), len(in)}
		prev := 0
		for _, c := range cuts {
			piece := append([]byte(nil), in[prev:c]...)
			out, n, end, err := d.decode(piece)
			data = append(data, out...)
			consumed += n
			if err != nil {
				derr = err
				break
			}
			if end {
				done = true
				break
			}
			if n != len(piece) {
				t.Fatalf("consumed %d of %d bytes without ending", n, len(piece))
			}
			prev = c
		}
		if derr != nil {
			return // stricter than net/http is allowed
		}
		ref, rerr := io.ReadAll(httputil.NewChunkedReader(bufio.NewReader(bytes.NewReader(in))))
		if done {
			if rerr != nil {
				t.Fatalf("decoder accepted %q, net/http: %v", in, rerr)
			}
			if !bytes.Equal(ref, data) {
				t.Fatalf("data %q, net/http %q", data, ref)
			}
			// The body ends at the final CRLF (after any trailer lines).
			if consumed < 5 || string(in[consumed-2:consumed]) != "\r\n" {
				t.Fatalf("ended at %d in %q", consumed, in)
			}
			return
		}
		// Incomplete: what was decoded so far is a prefix of net/http's data.
		if !bytes.HasPrefix(ref, data) {
			t.Fatalf("partial data %q is not a prefix of net/http's %q (%v)", data, ref, rerr)
		}
	})
}
