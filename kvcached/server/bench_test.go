package server

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/kvcached/store"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// reportLatencies adds p50/p99 in microseconds to a benchmark's output.
func reportLatencies(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Nanoseconds()) / 1e3 }
	b.ReportMetric(q(0.50), "p50-µs")
	b.ReportMetric(q(0.99), "p99-µs")
}

func benchServer(b *testing.B, ram, disk int64) (*redis.Client, *store.Store) {
	reg := prometheus.NewRegistry()
	st, err := store.Open(store.Config{RAMBytes: ram, DiskBytes: disk, Dir: b.TempDir(), Metrics: store.NewMetrics(reg)})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := New(Config{Store: st, Registry: reg})
	if err != nil {
		b.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(l)
	c := redis.NewClient(&redis.Options{Addr: l.Addr().String(), PoolSize: 1})
	b.Cleanup(func() {
		c.Close()
		srv.Close()
		st.Close()
	})
	return c, st
}

// redisServer starts a real redis-server on a free port for side-by-side
// numbers, or skips.
func redisServer(b *testing.B) *redis.Client {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		b.Skip("redis-server not installed (Debian package redis-server)")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 1})
	b.Cleanup(func() {
		c.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	for i := 0; c.Ping(context.Background()).Err() != nil; i++ {
		if i > 100 {
			b.Fatal("redis-server did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return c
}

// BenchmarkRAMTierGet256KiB: GET of a 256 KiB block held in RAM, through a
// real client over loopback TCP (one connection, no pipelining), against
// kvcached and, in the same run, redis-server.
func BenchmarkRAMTierGet256KiB(b *testing.B) {
	b.Run("kvcached", func(b *testing.B) {
		c, _ := benchServer(b, 1<<30, 0)
		benchGet256(b, c)
	})
	b.Run("redis-server", func(b *testing.B) { benchGet256(b, redisServer(b)) })
}

func benchGet256(b *testing.B, c *redis.Client) {
	ctx := context.Background()
	val := strings.Repeat("k", 256<<10)
	for i := 0; i < 16; i++ {
		if err := c.Set(ctx, fmt.Sprint("blk", i), val, 0).Err(); err != nil {
			b.Fatal(err)
		}
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(256 << 10)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		v, err := c.Get(ctx, fmt.Sprint("blk", i%16)).Bytes()
		lat = append(lat, time.Since(start))
		if err != nil || len(v) != 256<<10 {
			b.Fatal(err)
		}
	}
	reportLatencies(b, lat)
}

// BenchmarkSSDTierGet1MiB: GET of 1 MiB blocks that are only on the disk
// tier (the RAM tier holds two blocks, 64 are cycled), so each GET reads a
// block file, verifies its BLAKE3 checksum and promotes it. The files are in
// the page cache after the first pass: this measures kvcached's SSD-tier
// path, not the device.
func BenchmarkSSDTierGet1MiB(b *testing.B) {
	c, st := benchServer(b, 2<<20+1024, 1<<30)
	ctx := context.Background()
	val := strings.Repeat("d", 1<<20)
	const n = 64
	for i := 0; i < n; i++ {
		if err := c.Set(ctx, fmt.Sprint("blk", i), val, 0).Err(); err != nil {
			b.Fatal(err)
		}
	}
	if err := st.Flush(ctx); err != nil {
		b.Fatal(err)
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		v, err := c.Get(ctx, fmt.Sprint("blk", i%n)).Bytes()
		lat = append(lat, time.Since(start))
		if err != nil || len(v) != 1<<20 {
			b.Fatal(err)
		}
	}
	reportLatencies(b, lat)
}
