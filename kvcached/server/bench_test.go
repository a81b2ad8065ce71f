package server

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/testutil"
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
	srv, err := New(Config{Store: st, Registerer: reg})
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
	port := testutil.FreePort(b)
	testutil.Start(b, exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"))
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", port), PoolSize: 1})
	b.Cleanup(func() { c.Close() })
	testutil.Eventually(b, 5*time.Second, "redis-server to answer PING", func() bool {
		return c.Ping(context.Background()).Err() == nil
	})
	return c
}

// BenchmarkRAMTierGet256KiB: GET of a 256 KiB block held in RAM over
// loopback TCP (one connection, no pipelining), against kvcached and, in the
// same run, redis-server. go-redis stores the blocks; the GETs are sent by a
// minimal RESP client that reads replies into one reused buffer, so the
// benchmark process's garbage collector (which kvcached, running in it,
// shares) is not driven by the client's 256 KiB reply allocations.
func BenchmarkRAMTierGet256KiB(b *testing.B) {
	b.Run("kvcached", func(b *testing.B) {
		c, _ := benchServer(b, 1<<30, 0)
		benchGet256(b, c)
	})
	b.Run("redis-server", func(b *testing.B) { benchGet256(b, redisServer(b)) })
}

// rawGetter sends GET over one connection and reads the bulk reply into buf.
type rawGetter struct {
	nc  net.Conn
	br  *bufio.Reader
	buf []byte
}

func newRawGetter(b *testing.B, addr string) *rawGetter {
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	return &rawGetter{nc: nc, br: bufio.NewReaderSize(nc, 64<<10), buf: make([]byte, 0, 2<<20)}
}

func (g *rawGetter) get(key string) ([]byte, error) {
	if _, err := fmt.Fprintf(g.nc, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(key), key); err != nil {
		return nil, err
	}
	line, err := g.br.ReadSlice('\n')
	if err != nil {
		return nil, err
	}
	if len(line) < 4 || line[0] != '$' {
		return nil, fmt.Errorf("unexpected reply %q", line)
	}
	n, err := strconv.Atoi(string(line[1 : len(line)-2]))
	if err != nil || n < 0 || n > cap(g.buf) {
		return nil, fmt.Errorf("unexpected reply %q", line)
	}
	v := g.buf[:n+2]
	if _, err := io.ReadFull(g.br, v); err != nil {
		return nil, err
	}
	return v[:n], nil
}

func benchGet256(b *testing.B, c *redis.Client) {
	ctx := context.Background()
	val := strings.Repeat("k", 256<<10)
	for i := 0; i < 16; i++ {
		if err := c.Set(ctx, fmt.Sprint("blk", i), val, 0).Err(); err != nil {
			b.Fatal(err)
		}
	}
	g := newRawGetter(b, c.Options().Addr)
	keys := make([]string, 16)
	for i := range keys {
		keys[i] = fmt.Sprint("blk", i)
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(256 << 10)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		v, err := g.get(keys[i%16])
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
// path, not the device. GETs go through the minimal client, as above.
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
	g := newRawGetter(b, c.Options().Addr)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprint("blk", i)
	}
	lat := make([]time.Duration, 0, b.N)
	b.SetBytes(1 << 20)
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		start := time.Now()
		v, err := g.get(keys[i%n])
		lat = append(lat, time.Since(start))
		if err != nil || len(v) != 1<<20 {
			b.Fatal(err)
		}
	}
	reportLatencies(b, lat)
}

// BenchmarkPipelinedGetSet: 64-byte SETs and GETs of the same keys,
// pipelined 100 to a write over one connection as redis-benchmark -P sends
// them, so what is measured is the command path (parse, dispatch, reply)
// rather than round trips or copies of large values. One op is one batch.
func BenchmarkPipelinedGetSet(b *testing.B) {
	c, _ := benchServer(b, 1<<30, 0)
	nc, err := net.Dial("tcp", c.Options().Addr)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { nc.Close() })
	const pairs = 50
	val := strings.Repeat("v", 64)
	var batch, want strings.Builder
	for i := 0; i < pairs; i++ {
		k := fmt.Sprintf("key:%02d", i)
		fmt.Fprintf(&batch, "*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n", len(k), k, len(val), val)
		want.WriteString("+OK\r\n")
	}
	for i := 0; i < pairs; i++ {
		k := fmt.Sprintf("key:%02d", i)
		fmt.Fprintf(&batch, "*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n", len(k), k)
		fmt.Fprintf(&want, "$%d\r\n%s\r\n", len(val), val)
	}
	req, wantReply := []byte(batch.String()), want.String()
	br := bufio.NewReaderSize(nc, 64<<10)
	got := make([]byte, len(wantReply))
	roundTrip := func() {
		if _, err := nc.Write(req); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(br, got); err != nil {
			b.Fatal(err)
		}
	}
	roundTrip()
	if string(got) != wantReply {
		b.Fatalf("unexpected replies %q", got)
	}
	for b.Loop() {
		roundTrip()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*2*pairs), "ns/cmd")
}
