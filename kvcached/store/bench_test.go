package store

import (
	"fmt"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkDiskPut1MiB is the disk tier's share of a SET of 1 MiB that is
// written to disk: BLAKE3, the block file and the index entry, with 1,000
// keys rewritten in turn (redis-benchmark -r 1000), so each put replaces a
// block that is on disk.
func BenchmarkDiskPut1MiB(b *testing.B) {
	d, _, err := openDisk(b.TempDir(), 8<<30, hclog.NewNullLogger(), NewMetrics(prometheus.NewRegistry()), nil)
	if err != nil {
		b.Fatal(err)
	}
	defer d.close()
	val := make([]byte, 1<<20)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("key:%012d", i)
	}
	seq := uint64(0)
	for _, k := range keys {
		seq++
		if err := d.put(k, val, 0, seq); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(val)))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		seq++
		if err := d.put(keys[i%len(keys)], val, 0, seq); err != nil {
			b.Fatal(err)
		}
	}
}
