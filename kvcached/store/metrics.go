package store

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/oasis-llm/oasis/kvcached/internal/bufpool"
)

// Metrics are the store's Prometheus collectors, registered on a registry the
// caller owns.
type Metrics struct {
	Hits         *prometheus.CounterVec // by tier: ram, disk, peer
	Misses       prometheus.Counter
	Bytes        *prometheus.GaugeVec   // by tier: ram, disk
	Blocks       *prometheus.GaugeVec   // by tier: ram, disk
	Evictions    *prometheus.CounterVec // by tier: ram, disk
	Spills       prometheus.Counter
	SpillBytes   prometheus.Counter
	SpillErrors  prometheus.Counter
	SpillSkipped prometheus.Counter // dirty blocks evicted from RAM with no disk to take them
	Promotions   prometheus.Counter
	Corrupt      prometheus.Counter
	DiskDegraded prometheus.Gauge
	TooLarge     prometheus.Counter
	IndexDamaged prometheus.Counter   // disk indexes found damaged at open, moved aside
	PoolBytes    prometheus.GaugeFunc // read from the store's buffer pool at scrape time

	pool atomic.Pointer[bufpool.Pool] // set by Open
	// Resolved label values for the hot paths.
	hitRAM, hitDisk, hitPeer prometheus.Counter
	bytesRAM, bytesDisk      prometheus.Gauge
	blocksRAM, blocksDisk    prometheus.Gauge
	evictRAM, evictDisk      prometheus.Counter
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Hits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oasis_kvcached_hits_total", Help: "Lookups answered, by the tier that held the block (ram, disk, peer).",
		}, []string{"tier"}),
		Misses: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_misses_total", Help: "Lookups no tier could answer.",
		}),
		Bytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "oasis_kvcached_bytes", Help: "Bytes of block data held, by tier (ram, disk).",
		}, []string{"tier"}),
		Blocks: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "oasis_kvcached_blocks", Help: "Blocks held, by tier (ram, disk).",
		}, []string{"tier"}),
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "oasis_kvcached_evictions_total", Help: "Blocks evicted to stay within a tier's byte limit, by tier.",
		}, []string{"tier"}),
		Spills: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_spills_total", Help: "Blocks written from RAM to the disk tier.",
		}),
		SpillBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_spill_bytes_total", Help: "Bytes written from RAM to the disk tier.",
		}),
		SpillErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_spill_errors_total", Help: "Disk-tier writes that failed.",
		}),
		SpillSkipped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_spill_skipped_total", Help: "Blocks evicted from RAM that could not be written to disk (no disk tier, degraded, or failed).",
		}),
		Promotions: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_promotions_total", Help: "Blocks read from disk and promoted to RAM.",
		}),
		Corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_corrupt_blocks_total", Help: "Disk blocks whose checksum or framing failed: dropped, deleted and answered as misses.",
		}),
		DiskDegraded: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "oasis_kvcached_disk_degraded", Help: "1 while disk writes are failing (e.g. a full disk) and the store runs RAM-only.",
		}),
		TooLarge: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_values_too_large_total", Help: "Writes refused because the value exceeded the size limit.",
		}),
		IndexDamaged: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "oasis_kvcached_index_damaged_total", Help: "Disk indexes found damaged at open (corrupt or missing files, a malformed MANIFEST): moved aside to <data-dir>/index.damaged-<time>, the disk tier started empty.",
		}),
	}
	m.PoolBytes = prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "oasis_kvcached_buffer_pool_bytes", Help: "Bytes of released value buffers kept for reuse by the next values received or read from disk (outside the RAM tier's bytes).",
	}, func() float64 { return float64(m.pool.Load().Held()) })
	reg.MustRegister(m.Hits, m.Misses, m.Bytes, m.Blocks, m.Evictions, m.Spills, m.SpillBytes,
		m.SpillErrors, m.SpillSkipped, m.Promotions, m.Corrupt, m.DiskDegraded, m.TooLarge, m.IndexDamaged, m.PoolBytes)
	m.hitRAM, m.hitDisk, m.hitPeer = m.Hits.WithLabelValues("ram"), m.Hits.WithLabelValues("disk"), m.Hits.WithLabelValues("peer")
	m.bytesRAM, m.bytesDisk = m.Bytes.WithLabelValues("ram"), m.Bytes.WithLabelValues("disk")
	m.blocksRAM, m.blocksDisk = m.Blocks.WithLabelValues("ram"), m.Blocks.WithLabelValues("disk")
	m.evictRAM, m.evictDisk = m.Evictions.WithLabelValues("ram"), m.Evictions.WithLabelValues("disk")
	return m
}

func (m *Metrics) hit(t Tier) {
	switch t {
	case TierRAM:
		m.hitRAM.Inc()
	case TierDisk:
		m.hitDisk.Inc()
	default:
		m.hitPeer.Inc()
	}
}
