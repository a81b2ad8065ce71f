package peer

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/tlsfiles/tlsfilestest"
)

func benchPeers(b *testing.B, key string, val []byte) *Node {
	ca := tlsfilestest.NewCA(b, "bench CA")
	a := node(b, ca, &mapStore{m: map[string][]byte{key: val}})
	c := node(b, ca, &mapStore{m: map[string][]byte{}})
	c.cfg.FetchTimeout = 30 * time.Second
	c.SetPeers([]string{a.Addr().String()})
	c.RefreshFilters(context.Background())
	if _, err := c.Fetch(context.Background(), key); err != nil { // warm the connection
		b.Fatal(err)
	}
	c.mu.Lock()
	p := c.peers[peerKey{addr: a.Addr().String()}]
	c.mu.Unlock()
	p.mu.Lock()
	if p.conn != nil {
		// Whether quic-go batches packets into one sendmsg (UDP GSO).
		b.Logf("quic-go GSO: %t", p.conn.ConnectionState().GSO)
	}
	p.mu.Unlock()
	return c
}

// BenchmarkPeerFetch1MiB: one 1 MiB block fetched from a peer over QUIC with
// mutual TLS on loopback, on the connection kept open between fetches.
func BenchmarkPeerFetch1MiB(b *testing.B) {
	val := bytes.Repeat([]byte{7}, 1<<20)
	c := benchPeers(b, "blk", val)
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		v, err := c.Fetch(context.Background(), "blk")
		lat = append(lat, time.Since(start))
		if err != nil || len(v) != 1<<20 {
			b.Fatal(err)
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkPeerFetch32MiB: sustained throughput of 32 MiB block fetches
// (MB/s in the output).
func BenchmarkPeerFetch32MiB(b *testing.B) {
	val := bytes.Repeat([]byte{7}, 32<<20)
	c := benchPeers(b, "blk", val)
	b.SetBytes(32 << 20)
	b.ResetTimer()
	for b.Loop() {
		v, err := c.Fetch(context.Background(), "blk")
		if err != nil || len(v) != 32<<20 {
			b.Fatal(err)
		}
	}
}

// BenchmarkPeerFetch32MiBAs4Streams: the same 32 MiB per iteration as four
// concurrent 8 MiB fetches (four streams on the one connection), to see
// whether spreading a transfer over streams raises throughput.
func BenchmarkPeerFetch32MiBAs4Streams(b *testing.B) {
	ca := tlsfilestest.NewCA(b, "bench CA")
	m := map[string][]byte{}
	for i := range 4 {
		m[fmt.Sprint("blk", i)] = bytes.Repeat([]byte{byte(i)}, 8<<20)
	}
	a := node(b, ca, &mapStore{m: m})
	c := node(b, ca, &mapStore{m: map[string][]byte{}})
	c.cfg.FetchTimeout = 30 * time.Second
	c.SetPeers([]string{a.Addr().String()})
	c.RefreshFilters(context.Background())
	if _, err := c.Fetch(context.Background(), "blk0"); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(32 << 20)
	b.ResetTimer()
	for b.Loop() {
		var wg sync.WaitGroup
		errs := make([]error, 4)
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				v, err := c.Fetch(context.Background(), fmt.Sprint("blk", i))
				if err == nil && len(v) != 8<<20 {
					err = fmt.Errorf("fetched %d bytes", len(v))
				}
				errs[i] = err
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
}
