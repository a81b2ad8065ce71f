// Package presence publishes which blocks kvcached holds as vLLM KV events
// (internal/kvevents: ZMQ PUB, msgpack EventBatch), so the router can count a
// prefix offloaded to this node as a hit in a lower tier.
//
// # Key convention
//
// Only keys that carry a prefix hash produce events; others are stored but
// not announced. Two forms are recognised:
//
//   - LMCache's Redis connector keys, K + "kv_bytes" with
//     K = "{model}@{world_size}@{worker_id}@{chunk_hash_hex}@{dtype}[@tag%value...]".
//     LMCache's chunk hash is prefix-chained (it hashes the previous chunk's
//     hash with the chunk's tokens), so it identifies the whole prefix. It is
//     published as the block hash: an integer when it fits in 64 bits,
//     otherwise its bytes. The companion K + "metadata" key is not announced
//     (one event per chunk).
//   - Oasis-native keys "oasis@{model}@{digest_hex}[@...]" where digest_hex
//     is a 32-hex-digit internal/blockdigest digest; published as its 16
//     bytes.
//
// Events carry no token ids (kvcached never sees tokens): BlockStored has
// BlockHashes, BlockSize (the configured chunk size), no parent and empty
// TokenIDs; Medium is "CPU" for the RAM tier and "DISK" for the SSD tier.
// A consumer maps the hashes to its own keys through the engine-hash map it
// learned from the engine's own events, or uses a 16-byte hash directly as a
// blockdigest digest.
package presence

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/kvcached/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Media names the events use for kvcached's tiers.
const (
	MediumRAM  = kvevents.MediumCPU
	MediumDisk = kvevents.MediumDisk
)

// Config configures a Publisher.
type Config struct {
	Endpoint       string // ZMQ PUB bind address, e.g. "tcp://127.0.0.1:5557"
	ReplayEndpoint string // optional ZMQ ROUTER replay address
	Topic          string
	BlockSize      int // tokens per announced block (LMCache chunk_size); default 256
	// Logger receives the publisher's logs; nil discards them.
	Logger hclog.Logger
	// Registerer takes the publisher's metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// FlushInterval batches events (default 10ms); QueueSize bounds the
	// events waiting (default 65536; beyond it events are dropped and
	// counted).
	FlushInterval time.Duration
	QueueSize     int
}

type event struct {
	hash   kvevents.Hash
	stored bool
	medium string
}

// Publisher implements store.Observer: events queue from New on and are
// published in batches while Run runs; Close publishes what is left.
type Publisher struct {
	cfg Config
	log hclog.Logger
	pub *kvevents.Publisher
	ch  chan event
	// stop ends Run at Close.
	stop       context.Context
	stopCancel context.CancelFunc
	mu         sync.Mutex
	closed     bool
	wg         sync.WaitGroup // Run
	mEvents    *prometheus.CounterVec
	mDropped   prometheus.Counter
}

// New binds the publisher's sockets; Run publishes.
func New(cfg Config) (*Publisher, error) {
	if cfg.BlockSize <= 0 {
		cfg.BlockSize = 256
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 10 * time.Millisecond
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1 << 16
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Registerer == nil {
		cfg.Registerer = prometheus.NewRegistry()
	}
	pub, err := kvevents.NewPublisher(kvevents.PublisherConfig{
		Endpoint: cfg.Endpoint, ReplayEndpoint: cfg.ReplayEndpoint, Topic: cfg.Topic, Logger: cfg.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("starting presence publisher: %w", err)
	}
	p := &Publisher{cfg: cfg, log: cfg.Logger, pub: pub, ch: make(chan event, cfg.QueueSize)}
	p.mEvents = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "oasis_kvcached_presence_events_total", Help: "Block presence events published, by type and medium."}, []string{"type", "medium"})
	p.mDropped = prometheus.NewCounter(prometheus.CounterOpts{Name: "oasis_kvcached_presence_events_dropped_total", Help: "Presence events dropped because the publish queue was full."})
	if err := registerAll(cfg.Registerer, p.mEvents, p.mDropped); err != nil {
		pub.Close()
		return nil, fmt.Errorf("registering presence metrics: %w", err)
	}
	p.stop, p.stopCancel = context.WithCancel(context.Background())
	return p, nil
}

func registerAll(reg prometheus.Registerer, cs ...prometheus.Collector) error {
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// Run publishes queued events in batches, and serves replays, until ctx
// ends or Close; it returns nil then.
func (p *Publisher) Run(ctx context.Context) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.wg.Add(1)
	p.mu.Unlock()
	defer p.wg.Done()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(p.stop, cancel)()
	replayed := make(chan struct{})
	go func() {
		defer close(replayed)
		_ = p.pub.Run(ctx) // ends with ctx
	}()
	p.batch(ctx)
	<-replayed
	return nil
}

// Addr is the PUB socket's address.
func (p *Publisher) Addr() string { return p.pub.Addr().String() }

// Close ends Run, publishes the events still queued and closes the sockets.
func (p *Publisher) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	p.stopCancel()
	p.wg.Wait()
	p.flush(p.drain(nil))
	return p.pub.Close()
}

// drain appends the queued events to pending.
func (p *Publisher) drain(pending []event) []event {
	for {
		select {
		case e := <-p.ch:
			pending = append(pending, e)
		default:
			return pending
		}
	}
}

func medium(t store.Tier) string {
	if t == store.TierDisk {
		return MediumDisk
	}
	return MediumRAM
}

// Stored implements store.Observer.
func (p *Publisher) Stored(key string, t store.Tier) { p.enqueue(key, t, true) }

// Removed implements store.Observer.
func (p *Publisher) Removed(key string, t store.Tier) { p.enqueue(key, t, false) }

func (p *Publisher) enqueue(key string, t store.Tier, stored bool) {
	h, ok := ParseKey(key)
	if !ok {
		return
	}
	select {
	case p.ch <- event{hash: h, stored: stored, medium: medium(t)}:
	default:
		p.mDropped.Inc()
	}
}

func (p *Publisher) batch(ctx context.Context) {
	t := time.NewTicker(p.cfg.FlushInterval)
	defer t.Stop()
	var pending []event
	for {
		select {
		case e := <-p.ch:
			pending = append(pending, e)
			if len(pending) >= 1024 {
				pending = p.flush(pending)
			}
		case <-t.C:
			pending = p.flush(pending)
		case <-ctx.Done():
			p.flush(p.drain(pending))
			return
		}
	}
}

// flush publishes pending events as one batch, merging runs of the same
// type and medium into one event, in order.
func (p *Publisher) flush(pending []event) []event {
	if len(pending) == 0 {
		return pending
	}
	var evs []kvevents.Event
	for i := 0; i < len(pending); {
		j := i
		var hashes []kvevents.Hash
		for j < len(pending) && pending[j].stored == pending[i].stored && pending[j].medium == pending[i].medium {
			hashes = append(hashes, pending[j].hash)
			j++
		}
		if pending[i].stored {
			evs = append(evs, kvevents.BlockStored{BlockHashes: hashes, BlockSize: p.cfg.BlockSize, TokenIDs: []int32{}, Medium: pending[i].medium})
			p.mEvents.WithLabelValues("BlockStored", pending[i].medium).Add(float64(len(hashes)))
		} else {
			evs = append(evs, kvevents.BlockRemoved{BlockHashes: hashes, Medium: pending[i].medium})
			p.mEvents.WithLabelValues("BlockRemoved", pending[i].medium).Add(float64(len(hashes)))
		}
		i = j
	}
	ts := float64(time.Now().UnixNano()) / 1e9
	if _, err := p.pub.Publish(kvevents.EventBatch{TS: ts, Events: evs}); err != nil {
		p.log.Warn("publishing presence events", "error", err)
	}
	return pending[:0]
}

// ParseKey extracts the prefix hash a key carries (see the package doc).
func ParseKey(key string) (kvevents.Hash, bool) {
	if rest, ok := strings.CutPrefix(key, "oasis@"); ok {
		parts := strings.SplitN(rest, "@", 3)
		if len(parts) < 2 || len(parts[1]) != 32 {
			return kvevents.Hash{}, false
		}
		b, err := hex.DecodeString(parts[1])
		if err != nil {
			return kvevents.Hash{}, false
		}
		return kvevents.HashBytes(b), true
	}
	k, ok := strings.CutSuffix(key, "kv_bytes")
	if !ok {
		return kvevents.Hash{}, false
	}
	parts := strings.Split(k, "@")
	if len(parts) < 5 || parts[0] == "" {
		return kvevents.Hash{}, false
	}
	if _, err := strconv.Atoi(parts[1]); err != nil {
		return kvevents.Hash{}, false
	}
	if _, err := strconv.Atoi(parts[2]); err != nil {
		return kvevents.Hash{}, false
	}
	h := strings.TrimPrefix(strings.ToLower(parts[3]), "0x")
	if h == "" {
		return kvevents.Hash{}, false
	}
	if neg, ok := strings.CutPrefix(h, "-"); ok {
		// Python's builtin hash is signed; vLLM sends it as int64.
		v, err := strconv.ParseUint(neg, 16, 64)
		if err != nil || v > 1<<63 {
			return kvevents.Hash{}, false
		}
		return kvevents.HashUint64(uint64(-int64(v))), true
	}
	if len(h) <= 16 {
		v, err := strconv.ParseUint(h, 16, 64)
		if err != nil {
			return kvevents.Hash{}, false
		}
		return kvevents.HashUint64(v), true
	}
	if len(h)%2 == 1 {
		h = "0" + h
	}
	b, err := hex.DecodeString(h)
	if err != nil {
		return kvevents.Hash{}, false
	}
	return kvevents.HashBytes(b), true
}
