package peer

import (
	"github.com/oasis-llm/oasis/internal/bloom"

	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

// FuzzRequestFraming sends arbitrary requests (op, key) over a real QUIC
// stream between two nodes on loopback, through the client's framing
// (request) and the server's (serveStream), and checks the answer against the
// served store: a get of any key Fetch accepts (≤ maxKeyLen bytes) returns
// exactly that key's value or ErrNotFound, never another key's block (a
// KV-cache block served for the wrong key is wrong tokens downstream); a
// filter request returns a filter that unmarshals and holds every stored
// key; any other op is refused with an error.
func FuzzRequestFraming(f *testing.F) {
	f.Add(byte(opGet), "blk")
	f.Add(byte(opGet), "absent")
	f.Add(byte(opGet), "")
	f.Add(byte(opGet), strings.Repeat("k", 1<<16-1))
	f.Add(byte(opGet), strings.Repeat("k", maxKeyLen))
	f.Add(byte(opFilter), "")
	f.Add(byte(9), "blk")
	stored := map[string][]byte{
		"":    []byte("the empty key's block"),
		"blk": bytes.Repeat([]byte("0123456789abcdef"), 64),
		"k":   []byte("k's block"),
	}
	ca := tlsfilestest.NewCA(f, "kvcached fuzz CA")
	a := node(f, ca, &mapStore{m: stored})
	b := node(f, ca, &mapStore{m: map[string][]byte{}})
	b.SetPeers([]string{a.Addr().String()})
	p := b.peers[peerKey{addr: a.Addr().String()}]
	f.Fuzz(func(t *testing.T, op byte, key string) {
		if len(key) > maxKeyLen {
			return // Fetch refuses these before any framing
		}
		v, err := b.request(context.Background(), p, op, key, 1<<20)
		switch op {
		case opGet:
			want, ok := stored[key]
			switch {
			case ok && (err != nil || !bytes.Equal(v, want)):
				t.Fatalf("get of a %d-byte key: %q, %v; want %q", len(key), v, err, want)
			case !ok && !errors.Is(err, ErrNotFound):
				t.Fatalf("get of absent %d-byte key: %q, %v; want ErrNotFound", len(key), v, err)
			}
		case opFilter:
			if err != nil {
				t.Fatalf("filter: %v", err)
			}
			bl, err := bloom.Unmarshal(v)
			if err != nil {
				t.Fatalf("filter does not unmarshal: %v", err)
			}
			for k := range stored {
				if !bl.MayHave(k) {
					t.Fatalf("filter misses stored key %q", k)
				}
			}
		default:
			if err == nil || errors.Is(err, ErrNotFound) {
				t.Fatalf("op %d answered %q, %v; want an error", op, v, err)
			}
		}
	})
}
