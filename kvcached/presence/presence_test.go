package presence

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/kvcached/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/shoenig/test/must"
)

func TestParseKey(t *testing.T) {
	h, err := blockdigest.New(blockdigest.Domain{Model: "m"}, 4)
	must.NoError(t, err)
	d := h.Digests([]uint32{1, 2, 3, 4})[0]
	cases := []struct {
		key  string
		want kvevents.Hash
		ok   bool
	}{
		{"meta-llama/Llama-3.1-8B@1@0@1a2b@bfloat16kv_bytes", kvevents.HashUint64(0x1a2b), true},
		{"m@2@1@-10@half@tag%x" + "kv_bytes", kvevents.HashUint64(negU64(16)), true},
		{"m@1@0@" + "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff" + "@bfloat16kv_bytes",
			kvevents.HashBytes([]byte{0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff}), true},
		{"m@1@0@1a2b@bfloat16metadata", kvevents.Hash{}, false},
		{"oasis@m@" + d.String(), kvevents.HashBytes(d[:]), true},
		{"oasis@m@" + d.String() + "@kv", kvevents.HashBytes(d[:]), true},
		{"oasis@m@abc", kvevents.Hash{}, false},
		{"key:__rand_int__", kvevents.Hash{}, false},
		{"a@b@c@d@ekv_bytes", kvevents.Hash{}, false},
		{"m@1@0@zz@bfloat16kv_bytes", kvevents.Hash{}, false},
	}
	for _, tc := range cases {
		got, ok := ParseKey(tc.key)
		must.Eq(t, tc.ok, ok, must.Sprint(tc.key))
		if tc.ok {
			must.Eq(t, tc.want, got, must.Sprint(tc.key))
		}
	}
}

// TestStoreEventsReachASubscriber runs a store with the publisher as its
// observer and reads the events from a real ZMQ subscriber.
func TestStoreEventsReachASubscriber(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ep := "tcp://" + testutil.FreeAddr(t)
	p, err := New(Config{Endpoint: ep, BlockSize: 256})
	must.NoError(t, err)
	defer p.Close()
	go p.Run(ctx)
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: ep})
	must.NoError(t, err)
	defer sub.Close()
	go sub.Run(ctx)

	m := store.NewMetrics(prometheus.NewRegistry())
	s, err := store.Open(store.Config{RAMBytes: 150, DiskBytes: 1 << 20, Dir: t.TempDir(), Metrics: m, Observer: p})
	must.NoError(t, err)
	defer s.Close()

	// The SUB socket joins asynchronously: publish until something arrives.
	key := func(i int) string { return fmt.Sprintf("m@1@0@%x@bfloat16kv_bytes", i+1) }
	var msg kvevents.Message
	for i := 0; ; i++ {
		_, err := s.Set("warmup-not-announced", []byte("x"), 0, store.SetAlways)
		must.NoError(t, err)
		// A fresh key each round: only new blocks are announced.
		must.True(t, s.Delete(key(0)) || i == 0)
		_, err = s.Set(key(0), make([]byte, 100), 0, store.SetAlways)
		must.NoError(t, err)
		nctx, ncancel := context.WithTimeout(ctx, 200*time.Millisecond)
		msg, err = sub.Next(nctx)
		ncancel()
		if err == nil {
			break
		}
		must.Less(t, 50, i, must.Sprint("no events received"))
	}
	seen := map[string]bool{}
	record := func(b kvevents.EventBatch) {
		for _, e := range b.Events {
			switch e := e.(type) {
			case *kvevents.BlockStored:
				must.Eq(t, 256, e.BlockSize)
				for _, h := range e.BlockHashes {
					seen["stored/"+e.Medium+"/"+h.String()] = true
				}
			case kvevents.BlockStored:
				for _, h := range e.BlockHashes {
					seen["stored/"+e.Medium+"/"+h.String()] = true
				}
			case *kvevents.BlockRemoved:
				for _, h := range e.BlockHashes {
					seen["removed/"+e.Medium+"/"+h.String()] = true
				}
			case kvevents.BlockRemoved:
				for _, h := range e.BlockHashes {
					seen["removed/"+e.Medium+"/"+h.String()] = true
				}
			}
		}
	}
	record(msg.Batch)
	// A second block evicts the first from the 150-byte RAM tier; both
	// reach disk; deleting the second removes it everywhere.
	_, err = s.Set(key(1), make([]byte, 100), 0, store.SetAlways)
	must.NoError(t, err)
	must.NoError(t, s.Flush(ctx))
	must.True(t, s.Delete(key(1)))
	want := []string{"stored/CPU/1", "stored/DISK/1", "removed/CPU/1", "stored/CPU/2", "stored/DISK/2", "removed/CPU/2", "removed/DISK/2"}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		missing := false
		for _, w := range want {
			if !seen[w] {
				missing = true
			}
		}
		if !missing {
			return
		}
		nctx, ncancel := context.WithTimeout(ctx, time.Second)
		msg, err := sub.Next(nctx)
		ncancel()
		if err == nil {
			record(msg.Batch)
		}
	}
	t.Fatalf("events seen %v, want all of %v", seen, want)
}

func negU64(v int64) uint64 { return uint64(-v) }
