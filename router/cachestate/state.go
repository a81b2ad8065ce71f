// Package cachestate keeps the router's view of which engine holds which KV
// blocks, learned two ways:
//
//   - event-driven, for engines that publish vLLM-style KV events (the
//     oasis_kv_events service meta): one ZMQ subscriber per engine feeds an
//     EventWorker, which recomputes Oasis block digests from the events' token
//     ids; sequence gaps and reconnects are filled from the engine's replay
//     buffer (oasis_kv_events_replay, replay.go), and the worker resynchronises
//     (drops its entries) when replay cannot vouch for the gap, on publisher
//     restarts and on AllBlocksCleared;
//   - approximate, for engines without events (llama.cpp, openai_compat): the
//     router records its own routing decisions in a second index whose entries
//     expire after a TTL and are bounded by a model of the engine's cache: the
//     GPU, CPU and disk tiers it advertises (oasis_kv_capacity), written
//     through, or a GPU tier of ApproxCapacity blocks when it advertises none.
//
// Engines come and go with discovery: Sync starts and stops subscribers and
// drops the state of engines that left.
//
// Blocks offloaded to the node-local oasis-kvcached instances are learned
// from their presence events (SyncKVCaches, presence.go) and marked in lower
// tiers: CPU/disk for engines on the same node, peer for the others.
package cachestate

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"sort"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/router/metrics"
	"github.com/oasis-llm/oasis/router/prefixindex"
)

// Engine is what cachestate needs to know about one engine instance.
type Engine struct {
	ID        string // worker id (Consul/Nomad service instance id)
	Model     string // served model name: the digest domain
	Address   string // host:port of the engine, to resolve a wildcard events host
	BlockSize int    // tokens per KV block
	// KVEvents is the engine's ZMQ PUB endpoint ("" when it publishes none).
	KVEvents string
	// KVEventsReplay is the engine's replay ROUTER endpoint ("" when unknown):
	// with it a sequence gap is filled instead of resynchronised.
	KVEventsReplay string
	// Node is the engine's Nomad node id (oasis_node): kvcached on the same
	// node marks its blocks CPU/disk for it, kvcached elsewhere marks them peer.
	Node string
	// KVCapacity is the engine's cache in blocks per tier (oasis_kv_capacity),
	// the approximate record's model when the engine publishes no events; a
	// zero GPU tier means unknown (Config.ApproxCapacity).
	KVCapacity prefixindex.Capacity
}

// Config tunes a State.
type Config struct {
	// EventCapacity bounds each event-driven worker's index entries, a safety
	// net: the engine's own eviction events normally keep it smaller.
	EventCapacity int
	// ApproxCapacity models the GPU cache, in blocks, of an event-less engine
	// that advertises no oasis_kv_capacity.
	ApproxCapacity int
	// ApproxTTL forgets a routing decision after this long.
	ApproxTTL time.Duration
	// PresenceCapacity bounds the blocks tracked from kvcached presence
	// events (DefaultPresenceCapacity if 0).
	PresenceCapacity int
	// MaxWorkerBlocks bounds each tier of the cache model of an event-less
	// engine (DefaultMaxWorkerBlocks if 0): an advertised oasis_kv_capacity
	// above it is cut to it, logged and counted, so no registration makes
	// the router keep more than this many blocks for one engine.
	MaxWorkerBlocks int
	// MaxIndexBlocks bounds the entries of each of the two indexes (event-fed
	// and approximate), all engines together (DefaultMaxIndexBlocks if 0):
	// past it the least recently stored entry of any engine is evicted.
	MaxIndexBlocks int
	// InflightTTL is how long a routing decision to an event-driven engine
	// counts as held before its events confirm it (inflight.go): 0 is
	// DefaultInflightTTL, negative records no decisions for those engines.
	InflightTTL time.Duration
	// InflightWorkerBlocks and InflightMaxBlocks bound the in-flight record
	// per engine and in total (DefaultInflightWorkerBlocks and
	// DefaultInflightMaxBlocks if 0; each at most MaxWorkerBlocks and
	// MaxIndexBlocks).
	InflightWorkerBlocks int
	InflightMaxBlocks    int
	// Metrics, when set, counts capacity clamps and budget evictions.
	Metrics *metrics.Metrics
	Logger  hclog.Logger
	// Now is the clock (tests and the cluster simulator drive their own).
	Now func() time.Time
}

// Defaults for Config's zero fields.
const (
	DefaultEventCapacity  = 1 << 20
	DefaultApproxCapacity = 1 << 15 // 512k tokens of 16-token blocks
	DefaultApproxTTL      = 10 * time.Minute
	// DefaultMaxWorkerBlocks is 32M tokens of 16-token blocks: an engine's
	// GPU, CPU and disk tiers as large as the README's example.
	DefaultMaxWorkerBlocks = 1 << 21
	// DefaultMaxIndexBlocks bounds each index to about 250 MiB (about 60
	// bytes per entry).
	DefaultMaxIndexBlocks = 1 << 22
)

// State is the router's cache view. Its methods are safe for concurrent use.
type State struct {
	cfg    Config
	log    hclog.Logger
	dig    *Digester
	events *prefixindex.Index
	approx *prefixindex.Index
	// inflight records decisions to event-driven engines until their events
	// arrive (nil: off); fold merges its matches.
	inflight *prefixindex.Index
	fold     InflightMatcher

	mu      sync.Mutex
	engines map[string]*engineState

	// kvcached presence (presence.go). Lock order: mu before pmu.
	pmu             sync.Mutex
	caches          map[string]*cacheState
	holders         map[uint64][]holder // index key → kvcached instances holding it
	presenceWorkers map[string]string   // event-driven worker id → node
	presenceCap     int
}

type engineState struct {
	eng    Engine
	events bool
	ew     *EventWorker
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex // guards ew against Stats readers
}

// New returns an empty State.
func New(cfg Config) *State {
	if cfg.EventCapacity <= 0 {
		cfg.EventCapacity = DefaultEventCapacity
	}
	if cfg.ApproxCapacity <= 0 {
		cfg.ApproxCapacity = DefaultApproxCapacity
	}
	if cfg.ApproxTTL <= 0 {
		cfg.ApproxTTL = DefaultApproxTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PresenceCapacity <= 0 {
		cfg.PresenceCapacity = DefaultPresenceCapacity
	}
	if cfg.MaxWorkerBlocks <= 0 {
		cfg.MaxWorkerBlocks = DefaultMaxWorkerBlocks
	}
	if cfg.MaxIndexBlocks <= 0 {
		cfg.MaxIndexBlocks = DefaultMaxIndexBlocks
	}
	cfg.ApproxCapacity = min(cfg.ApproxCapacity, cfg.MaxWorkerBlocks)
	if cfg.InflightTTL == 0 {
		cfg.InflightTTL = DefaultInflightTTL
	}
	if cfg.InflightWorkerBlocks <= 0 {
		cfg.InflightWorkerBlocks = DefaultInflightWorkerBlocks
	}
	if cfg.InflightMaxBlocks <= 0 {
		cfg.InflightMaxBlocks = DefaultInflightMaxBlocks
	}
	cfg.InflightWorkerBlocks = min(cfg.InflightWorkerBlocks, cfg.MaxWorkerBlocks)
	cfg.InflightMaxBlocks = min(cfg.InflightMaxBlocks, cfg.MaxIndexBlocks)
	var inflight *prefixindex.Index
	if cfg.InflightTTL > 0 {
		inflight = NewInflightIndex(cfg.InflightTTL, cfg.InflightWorkerBlocks, cfg.InflightMaxBlocks,
			budgetCounter(cfg.Metrics, "inflight"))
	}
	return &State{
		inflight: inflight,
		cfg:      cfg,
		log:      cfg.Logger,
		dig:      NewDigester(),
		events: prefixindex.New(prefixindex.Config{DefaultCapacity: cfg.EventCapacity, MaxEntries: cfg.MaxIndexBlocks,
			OnBudgetEvict: budgetCounter(cfg.Metrics, "events")}),
		approx: prefixindex.New(prefixindex.Config{DefaultCapacity: cfg.ApproxCapacity, TTL: int64(cfg.ApproxTTL),
			MaxEntries: cfg.MaxIndexBlocks, OnBudgetEvict: budgetCounter(cfg.Metrics, "approx")}),
		engines: make(map[string]*engineState),

		caches:          make(map[string]*cacheState),
		holders:         make(map[uint64][]holder),
		presenceWorkers: map[string]string{},
		presenceCap:     cfg.PresenceCapacity,
	}
}

// budgetCounter counts an index's budget evictions in m (nil: nowhere).
func budgetCounter(m *metrics.Metrics, index string) func(int) {
	if m == nil {
		return nil
	}
	c := m.IndexBudgetEvictions.WithLabelValues(index)
	return func(n int) { c.Add(float64(n)) }
}

// Digester returns the State's digester, for computing request keys.
func (s *State) Digester() *Digester { return s.dig }

// EventIndex and ApproxIndex expose the two indexes (read-mostly use: Match, Stats).
func (s *State) EventIndex() *prefixindex.Index  { return s.events }
func (s *State) ApproxIndex() *prefixindex.Index { return s.approx }

// ResolveEndpoint turns an engine's advertised events endpoint into one the
// router can dial: a wildcard or empty host ("tcp://*:5557") is replaced by
// the host of the engine's API address.
func ResolveEndpoint(endpoint, apiAddress string) (string, error) {
	u, err := url.Parse(endpoint)
	if err != nil || u.Scheme != "tcp" || u.Port() == "" {
		return "", fmt.Errorf("kv events endpoint %q: want tcp://host:port", endpoint)
	}
	host := u.Hostname()
	if host == "*" || host == "" || host == "0.0.0.0" || host == "::" {
		h, _, err := net.SplitHostPort(apiAddress)
		if err != nil {
			return "", fmt.Errorf("kv events endpoint %q has a wildcard host and the engine address %q has none: %w", endpoint, apiAddress, err)
		}
		host = h
	}
	return "tcp://" + net.JoinHostPort(host, u.Port()), nil
}

// Sync makes the State follow exactly the given engines: new event-driven
// engines get a subscriber, engines whose endpoint changed are resubscribed
// from scratch, engines that left lose their subscriber and their entries.
func (s *State) Sync(ctx context.Context, engines []Engine) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]bool, len(engines))
	for _, e := range engines {
		seen[e.ID] = true
		old, ok := s.engines[e.ID]
		if ok && old.eng == e {
			continue
		}
		if ok {
			s.stopLocked(old)
		}
		s.startLocked(ctx, e)
	}
	for id, es := range s.engines {
		if !seen[id] {
			s.stopLocked(es)
		}
	}
	workers := make(map[string]string, len(s.engines))
	for id, es := range s.engines {
		if es.events {
			workers[id] = es.eng.Node
		}
	}
	s.syncPresenceWorkersLocked(workers)
}

func (s *State) startLocked(ctx context.Context, e Engine) {
	es := &engineState{eng: e}
	s.engines[e.ID] = es
	if e.KVEvents == "" {
		s.addApproxLocked(e)
		return
	}
	endpoint, err := ResolveEndpoint(e.KVEvents, e.Address)
	if err != nil {
		s.log.Warn("engine has an unusable kv events endpoint; learning from routing decisions instead", "engine", e.ID, "error", err)
		s.addApproxLocked(e)
		return
	}
	if err := s.events.AddWorker(e.ID, 0); err != nil {
		s.log.Error("cannot index engine", "engine", e.ID, "error", err)
		return
	}
	if s.inflight != nil {
		if err := s.inflight.AddWorker(e.ID, 0); err != nil {
			s.log.Warn("cannot record routing decisions for engine; matching its events alone", "engine", e.ID, "error", err)
		}
	}
	es.events = true
	es.ew = NewEventWorker(e.ID, e.Model, s.events, s.dig)
	sctx, cancel := context.WithCancel(ctx)
	es.cancel, es.done = cancel, make(chan struct{})
	replay := ""
	if e.KVEventsReplay != "" {
		if replay, err = ResolveEndpoint(e.KVEventsReplay, e.Address); err != nil {
			s.log.Warn("ignoring unusable kv events replay endpoint", "engine", e.ID, "error", err)
			replay = ""
		}
	}
	go s.subscribe(sctx, es, endpoint, replay)
}

// addApproxLocked follows an engine from the router's own decisions, with
// its advertised cache as the model (each tier at most MaxWorkerBlocks),
// else a GPU tier of ApproxCapacity.
func (s *State) addApproxLocked(e Engine) {
	c := e.KVCapacity
	if c.GPU <= 0 {
		c = prefixindex.Capacity{GPU: s.cfg.ApproxCapacity}
	}
	if clamped, ok := clampCapacity(c, s.cfg.MaxWorkerBlocks); ok {
		s.log.Warn("engine advertises a larger cache than the router models for one engine; modelling the bound (-index-worker-max-blocks)",
			"engine", e.ID, "gpu", c.GPU, "cpu", c.CPU, "disk", c.Disk, "max_blocks", s.cfg.MaxWorkerBlocks)
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.KVCapacityClamped.Inc()
		}
		c = clamped
	}
	if err := s.approx.AddTieredWorker(e.ID, c); err != nil {
		s.log.Warn("ignoring the engine's kv capacity; modelling the default", "engine", e.ID, "error", err)
		_ = s.approx.AddTieredWorker(e.ID, prefixindex.Capacity{GPU: s.cfg.ApproxCapacity})
	}
}

// clampCapacity cuts each tier of c to limit blocks, and reports whether any
// was over it. The tiers are written through, so the record of one engine
// then holds at most limit blocks.
func clampCapacity(c prefixindex.Capacity, limit int) (prefixindex.Capacity, bool) {
	if c.GPU <= limit && c.CPU <= limit && c.Disk <= limit {
		return c, false
	}
	return prefixindex.Capacity{GPU: min(c.GPU, limit), CPU: min(c.CPU, limit), Disk: min(c.Disk, limit)}, true
}

func (s *State) stopLocked(es *engineState) {
	if es.cancel != nil {
		es.cancel()
		<-es.done
	}
	s.events.RemoveWorker(es.eng.ID)
	s.approx.RemoveWorker(es.eng.ID)
	if s.inflight != nil {
		s.inflight.RemoveWorker(es.eng.ID)
	}
	delete(s.engines, es.eng.ID)
}

// subscribe feeds one engine's events into its EventWorker until ctx ends.
// The subscriber redials by itself; what a reconnect lost shows up as a
// sequence gap (or a restart) on the next message, which the engine's replay
// buffer fills when it has one (replay.go) and resynchronises otherwise.
func (s *State) subscribe(ctx context.Context, es *engineState, endpoint, replay string) {
	defer close(es.done)
	log := s.log.With("engine", es.eng.ID, "endpoint", endpoint)
	broken := func(err error) {
		// The stream broke in a way the subscriber cannot resume: whatever
		// comes next may have missed events, so start over clean.
		log.Warn("kv events stream failed; resynchronising", "error", err)
		es.mu.Lock()
		_ = es.ew.Resync()
		es.mu.Unlock()
	}
	handle := func(rp *replayer, m kvevents.Message) {
		// The replay round trip runs outside the lock; see replayer.
		batches, replayed := rp.prepare(m)
		if m.Missed > 0 || m.Restarted {
			if replayed {
				log.Debug("kv events gap filled from the replay buffer", "missed", m.Missed, "restarted", m.Restarted, "seq", m.Seq, "batches", len(batches)-1)
			} else {
				log.Info("kv events gap; resynchronising", "missed", m.Missed, "restarted", m.Restarted, "seq", m.Seq, "replay", replay != "")
			}
		}
		es.mu.Lock()
		cleared := es.ew.stats.Resyncs + es.ew.stats.Clears
		err := rp.apply(es.ew, batches, replayed, s.cfg.Now().UnixNano())
		cleared = es.ew.stats.Resyncs + es.ew.stats.Clears - cleared
		es.mu.Unlock()
		if cleared > 0 {
			// The worker's entries went, kvcached's marks with them: what a
			// kvcached still holds is still reachable from this worker.
			s.restorePresenceMarks(es.eng.ID)
		}
		if err != nil {
			log.Warn("applying kv events", "error", err)
		}
	}
	followEvents(ctx, log, endpoint, replay, broken, handle)
}

// followEvents subscribes to a stream of KV-event batches (an engine's, or a
// kvcached's presence events) and hands each message to handle, with the
// stream's replayer, until ctx ends. When the stream breaks beyond what the
// subscriber resumes, broken drops what came from it and the replayer starts
// over after a short pause.
func followEvents(ctx context.Context, log hclog.Logger, endpoint, replay string,
	broken func(error), handle func(*replayer, kvevents.Message)) {
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: endpoint, Logger: log})
	if err != nil {
		log.Error("cannot subscribe to kv events", "error", err)
		return
	}
	defer sub.Close()
	go sub.Run(ctx) // ends with ctx or at Close
	var fetch ReplayFunc
	if replay != "" {
		fetch = func(from int64) ([]kvevents.Message, error) {
			rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			return kvevents.Replay(rctx, replay, "", from)
		}
	}
	rp := newReplayer(fetch)
	for {
		m, err := sub.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			broken(err)
			rp.reset()
			select {
			case <-ctx.Done():
				return
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		handle(rp, m)
	}
}

// Close stops every subscriber. It returns nil: a subscriber's socket
// closes without an error worth acting on.
func (s *State) Close() error {
	s.SyncKVCaches(context.Background(), nil)
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, es := range s.engines {
		s.stopLocked(es)
	}
	return nil
}

// EventDriven reports whether the engine's state comes from its events.
func (s *State) EventDriven(id string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	es, ok := s.engines[id]
	return ok && es.events
}

// EngineStats returns the event counters of an event-driven engine.
func (s *State) EngineStats(id string) (EventStats, bool) {
	s.mu.Lock()
	es, ok := s.engines[id]
	s.mu.Unlock()
	if !ok || es.ew == nil {
		return EventStats{}, false
	}
	es.mu.Lock()
	defer es.mu.Unlock()
	return es.ew.Stats(), true
}

// Record learns a routing decision: the engine that served keys is assumed
// to hold them now. For an engine without events that is the approximate
// record; for an event-driven one a short-lived in-flight entry that stands
// in for its events until they arrive (InflightTTL; none when negative).
func (s *State) Record(id string, keys []uint64) {
	s.mu.Lock()
	es, ok := s.engines[id]
	s.mu.Unlock()
	if !ok || len(keys) == 0 {
		return
	}
	now := s.cfg.Now().UnixNano()
	if es.events {
		if s.inflight == nil {
			return
		}
		if err := s.inflight.Store(id, prefixindex.TierGPU, keys, now); err != nil {
			s.log.Debug("recording in-flight routing decision", "engine", id, "error", err)
		}
		s.inflight.Expire(now)
		return
	}
	if err := s.approx.Store(id, prefixindex.TierGPU, keys, now); err != nil {
		s.log.Debug("recording routing decision", "engine", id, "error", err)
	}
	s.approx.Expire(now)
}

// Forget takes back the in-flight entries of keys for engine id (an engine
// with KV events that did not take the request Record credited it with).
// The engine's own events are untouched.
func (s *State) Forget(id string, keys []uint64) {
	s.mu.Lock()
	es, ok := s.engines[id]
	s.mu.Unlock()
	if !ok || !es.events || s.inflight == nil || len(keys) == 0 {
		return
	}
	if err := s.inflight.Remove(id, prefixindex.TierGPU, keys, nil); err != nil {
		s.log.Debug("taking back an in-flight routing decision", "engine", id, "error", err)
	}
}

// Match returns every engine's longest held prefix of keys: from its events
// or the approximate record (an engine is in only one of them), and for an
// event-driven engine the longer of that and its in-flight decisions.
func (s *State) Match(keys []uint64, w prefixindex.TierWeights, out []prefixindex.Match) []prefixindex.Match {
	start := len(out)
	out = s.events.Match(keys, w, out)
	out = s.fold.Match(s.inflight, keys, w, out, start)
	return s.approx.Match(keys, w, out)
}

// InflightIndex exposes the in-flight record (nil when off).
func (s *State) InflightIndex() *prefixindex.Index { return s.inflight }

// Keys computes a request's index keys for a model and block size.
func (s *State) Keys(dst []uint64, model string, blockSize int, tokens []uint32) ([]uint64, error) {
	return s.dig.AppendKeys(dst, blockdigest.Domain{Model: model}, blockSize, tokens)
}

// AdapterKeys computes a request's index keys for a LoRA adapter of a
// model: the domain vLLM's KV events name by lora_name.
func (s *State) AdapterKeys(dst []uint64, model, adapter string, blockSize int, tokens []uint32) ([]uint64, error) {
	return s.dig.AppendKeys(dst, blockdigest.Domain{Model: model, LoRA: adapter}, blockSize, tokens)
}

// Engines lists the engines followed, sorted by id.
func (s *State) Engines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	ids := make([]string, 0, len(s.engines))
	for id := range s.engines {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}
