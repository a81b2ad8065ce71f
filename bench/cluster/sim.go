package cluster

import (
	"container/heap"
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/oasis-llm/oasis/internal/blockdigest"
	"github.com/oasis-llm/oasis/internal/kvevents"
	"github.com/oasis-llm/oasis/router/cachestate"
	"github.com/oasis-llm/oasis/router/policy"
	"github.com/oasis-llm/oasis/router/prefixindex"
	"github.com/oasis-llm/oasis/router/scoring"
	"github.com/oasis-llm/oasis/sim/engine"
)

// GPU is one worker's hardware model: oasis-sim's step-time and power models
// and its KV capacity.
type GPU struct {
	Name   string
	Timing engine.Timing
	Power  engine.PowerModel
	Blocks int // KV blocks of 16 tokens
	// CPUBlocks is the host-memory offloading tier (vLLM native offloading),
	// 0 for none.
	CPUBlocks int
	// DiskBlocks is oasis-kvcached's SSD tier below it (through LMCache), 0 for
	// none.
	DiskBlocks int
}

// BlocksForGiB is the blocks of blockSize tokens that gib GiB of an offloading
// tier hold (128 KiB of KV per token, Llama-3-8B BF16).
func BlocksForGiB(gib float64, blockSize int) int {
	return int(gib * (1 << 30) / float64(128*1024*blockSize))
}

// GPU models for Llama-3-8B BF16. H100 is oasis-sim's default model. The
// others scale it by datasheet ratios (memory bandwidth for the per-step and
// per-sequence terms, dense BF16 TFLOPS for prefill, board power):
// A100 SXM 80GB 2.0 TB/s, 312 TFLOPS, 400 W; L40S 48GB 0.86 TB/s, 362 TFLOPS, 350 W;
// both load offloaded KV over PCIe Gen4 x16 (~25 GB/s: 5.2 µs per token). Every GPU
// loads from the disk tier at one NVMe Gen4 SSD's ~6.5 GB/s (20 µs per token).
var (
	H100 = GPU{"H100", engine.DefaultTiming(), engine.DefaultPower(), engine.BlocksForMemory(0.9, 16), 0, 0}
	A100 = GPU{"A100", engine.Timing{StepBase: 10 * time.Millisecond, PerPrefillToken: 95 * time.Microsecond, PerDecodeSeq: 84 * time.Microsecond, PerLoadedToken: 5200 * time.Nanosecond, PerDiskLoadedToken: 20 * time.Microsecond},
		engine.PowerModel{IdleWatts: 55, WattsPerUtil: 345}, engine.BlocksForMemory(0.9, 16), 0, 0}
	L40S = GPU{"L40S", engine.Timing{StepBase: 23 * time.Millisecond, PerPrefillToken: 82 * time.Microsecond, PerDecodeSeq: 195 * time.Microsecond, PerLoadedToken: 5200 * time.Nanosecond, PerDiskLoadedToken: 20 * time.Microsecond},
		engine.PowerModel{IdleWatts: 35, WattsPerUtil: 315}, 12902, 0, 0} // (48 GB × 0.9 − 18 GiB) / 2 MiB per block
)

// Heterogeneous returns n workers: half H100, a quarter A100, a quarter L40S,
// interleaved.
func Heterogeneous(n int) []GPU {
	pattern := []GPU{H100, A100, H100, L40S}
	out := make([]GPU, n)
	for i := range out {
		out[i] = pattern[i%len(pattern)]
	}
	return out
}

// Policies compared by the benchmark.
const (
	PolicyRandom     = "random"
	PolicyRoundRobin = "round_robin"
	PolicyLeastLoad  = "least_load"
	PolicyPrefix     = "prefix"
	PolicyOasis      = "oasis"
)

// Policies lists them in report order.
var Policies = []string{PolicyRandom, PolicyRoundRobin, PolicyLeastLoad, PolicyPrefix, PolicyOasis}

// Learning modes of the prefix-aware policies.
const (
	LearnEvents = "events" // KV events from every engine, through cachestate.EventWorker
	LearnApprox = "approx" // the router's own decisions, LRU capacity + TTL
)

// DefaultOasisWeights is the Oasis weighted policy used by the benchmark: the
// router's shipped default, so what the benchmark measures is what users get.
func DefaultOasisWeights() map[string]float64 { return policy.DefaultWeights() }

// Config is one simulation run.
type Config struct {
	GPUs       []GPU // one per worker
	Policy     string
	Learning   string
	EventDelay time.Duration
	EventLoss  float64 // probability that one event batch is lost
	// EventReplay lets the learner fill a sequence gap from the engine's
	// replay buffer (the last ReplayBuffer batches, as vLLM's buffer_steps)
	// instead of resynchronising.
	EventReplay bool
	RateScale   float64 // arrivals at trace time / RateScale
	Weights     map[string]float64
	LoadSlack   float64 // prefix term's hot-spot ε (oasis policy)
	// Recompute is the ttft term's κ (oasis policy; 0: the default,
	// scoring.DefaultRecompute; negative: none, this request's wait alone).
	Recompute float64
	ApproxTTL time.Duration
	// InflightRecompute is the ttft term's κ_f, for tokens only the router's
	// in-flight record holds (oasis policy, KV events; 0: the default,
	// scoring.DefaultInflightRecompute; negative: none).
	InflightRecompute float64
	// InflightTTL is how long Oasis's router counts a decision to an engine
	// with KV events as held before the events confirm it, as
	// cachestate.Config.InflightTTL (0: cachestate.DefaultInflightTTL;
	// negative: none, the events alone).
	InflightTTL time.Duration
	BlockSize   int
	Seed        uint64
	Model       string
	// DecodePower is the dynamic power of a step's decode part at batch 1, as
	// a fraction of the GPU's full dynamic power, rising linearly to full at
	// DecodePowerBatch sequences; 0 or 1: every step draws full power.
	DecodePower float64
	// DynamoTemperature is the dynamo peer policy's router_temperature (0,
	// its default: the lowest cost).
	DynamoTemperature float64
	// Autoscale, when set, runs an autoscaled fleet over the GPUs (one
	// slot each; autoscale.go) instead of every GPU serving throughout.
	Autoscale *AutoscaleConfig
	// Routers is how many routers share the workers (routers.go; the
	// system job's one per node), each receiving its share of the
	// arrivals; 0 or 1: one router. Oasis's own policies only, no
	// Autoscale.
	Routers int
	// ShareLoads has the routers send each other their per-worker
	// in-flight and pending prefill when router/peers does: as soon as a
	// router's own requests on a worker change, at most every
	// PeerMinInterval, at least every PeerInterval (peers.Schedule),
	// delivered PeerDelay later.
	ShareLoads bool
	// ShareSignals is the upper bound of sharing, which no router does:
	// every router reads and writes one worker.Live per worker (its
	// in-flight requests, pending prefill and learned prefill rate, all
	// routers' at once, instantly), as if the routers were one. Exclusive
	// with ShareLoads and SharePrefixes.
	ShareSignals bool
	// SharePrefixes has them send their approximate prefix records
	// (router/peers' Outbox) with those messages too (approx learning); a
	// record is a change, as peers.Peers.Routed makes it.
	SharePrefixes bool
	// PeerInterval is the longest time between two messages of a router
	// (0: peers.DefaultInterval), PeerMinInterval the shortest (0:
	// peers.DefaultMinInterval), PeerDelay a message's delivery time (0:
	// DefaultPeerDelay).
	PeerInterval    time.Duration
	PeerMinInterval time.Duration
	PeerDelay       time.Duration
}

// DecodePowerBatch is the decode batch at which a step draws full power in the
// DecodePower model.
const DecodePowerBatch = 64

// decodePower is the share of full dynamic power a step decoding n sequences
// draws outside its prefill part.
func (s *sim) decodePower(n int) float64 {
	a := s.cfg.DecodePower
	if a <= 0 || a >= 1 {
		return 1
	}
	return a + (1-a)*min(1, float64(n)/DecodePowerBatch)
}

// Result is one run's measurements.
type Result struct {
	Policy     string  `json:"policy"`
	Learning   string  `json:"learning,omitempty"`
	Workers    int     `json:"workers"`
	RateScale  float64 `json:"rate_scale"`
	Rate       float64 `json:"rate_rps"`
	EventDelay float64 `json:"event_delay_s,omitempty"`
	EventLoss  float64 `json:"event_loss,omitempty"`
	Replay     bool    `json:"event_replay,omitempty"`
	// DecodePower as configured (0: full power at any batch).
	DecodePower float64 `json:"decode_power,omitempty"`

	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	Rejected  int `json:"rejected"`

	HitRatio       float64 `json:"hit_ratio"`
	OracleHitRatio float64 `json:"oracle_hit_ratio"`
	TTFTP50        float64 `json:"ttft_p50_s"`
	TTFTP90        float64 `json:"ttft_p90_s"`
	TTFTP99        float64 `json:"ttft_p99_s"`
	// TPOT per request with more than one output token: (last token − first
	// token) / (output − 1).
	TPOTP50        float64 `json:"tpot_p50_s"`
	TPOTP90        float64 `json:"tpot_p90_s"`
	TPOTP99        float64 `json:"tpot_p99_s"`
	Throughput     float64 `json:"throughput_rps"`
	OutputTokPS    float64 `json:"output_tokens_per_s"`
	Imbalance      float64 `json:"imbalance"`
	JoulesPerToken float64 `json:"joules_per_token"`
	EnergyJ        float64 `json:"energy_j"`
	// EnergyJ split: idle draw over the makespan, busy draw while steps
	// computed or loaded prompt KV, and the rest of the busy draw (decoding,
	// per-step overhead).
	IdleEnergyJ    float64 `json:"idle_energy_j"`
	PrefillEnergyJ float64 `json:"prefill_energy_j"`
	DecodeEnergyJ  float64 `json:"decode_energy_j"`
	Makespan       float64 `json:"makespan_s"`
	// LastArrival is when the last request arrived, s from the run's start.
	LastArrival float64 `json:"last_arrival_s"`
	Resyncs     int64   `json:"resyncs,omitempty"`
	Replays     int64   `json:"replays,omitempty"`
	Preemptions uint64  `json:"preemptions"`
	WallSeconds float64 `json:"wall_s"`
	// Routers as configured (0: one), and what they shared.
	Routers       int  `json:"routers,omitempty"`
	ShareLoads    bool `json:"share_loads,omitempty"`
	SharePrefixes bool `json:"share_prefixes,omitempty"`
	// ShareSignals: the routers shared one worker.Live per worker.
	ShareSignals bool `json:"share_signals,omitempty"`
	// PrefixDrops are prefix records the outbox bound dropped.
	PrefixDrops int `json:"prefix_drops,omitempty"`
	// PeerMessages are the load messages the routers sent (each to every
	// other router), PeerBytes their size as router/peers encodes them
	// (peers.Encode, with engine ids as long as Nomad's service ids).
	PeerMessages int64 `json:"peer_messages,omitempty"`
	PeerBytes    int64 `json:"peer_bytes,omitempty"`
}

// MeetsSLO reports TTFT p90 ≤ 2 s.
func (r Result) MeetsSLO() bool { return r.TTFTP90 <= 2 }

// Keys computes every request's router block keys once: the real chained
// BLAKE3 digests of blockdigest over the expanded token ids, shared by all
// runs over the same trace. Trace hash ids identify whole prefixes, so the
// digests of a hash id's sub-blocks are memoised (keyed by id and checked
// against the parent digest) and each distinct block is hashed once.
func Keys(reqs []*Request, model string, blockSize int) error {
	h, err := blockdigest.New(blockdigest.Domain{Model: model}, blockSize)
	if err != nil {
		return err
	}
	type memo struct {
		parent  blockdigest.Digest
		digests []blockdigest.Digest
	}
	memos := make(map[int64]*memo)
	block := make([]uint32, blockSize)
	for _, r := range reqs {
		if r.keys != nil {
			continue
		}
		keys := make([]uint64, 0, r.Input/blockSize)
		parent := blockdigest.Root
		for k, id := range r.HashIDs {
			full := min(TraceBlock, r.Input-k*TraceBlock) / blockSize
			m := memos[id]
			if m == nil {
				m = &memo{parent: parent}
				memos[id] = m
			} else if m.parent != parent {
				m = &memo{parent: parent} // not a prefix id after all: do not share
			}
			for j := len(m.digests); j < full; j++ {
				for t := range block {
					block[t] = uint32(mix(uint64(id)<<10|uint64(j*blockSize+t)) % vocab)
				}
				p := m.parent
				if j > 0 {
					p = m.digests[j-1]
				}
				d, err := h.Extend(p, block)
				if err != nil {
					return err
				}
				m.digests = append(m.digests, d)
			}
			for _, d := range m.digests[:full] {
				keys = append(keys, cachestate.Key(d))
			}
			if full*blockSize < TraceBlock {
				break // a partial block ends the request
			}
			parent = m.digests[full-1]
		}
		r.keys = keys
	}
	return nil
}

// source is the prefix term's view in the simulator: the request's keys were
// computed by Keys; matching runs on the real indexes.
type source struct {
	keys   []uint64
	events *prefixindex.Index
	approx *prefixindex.Index
	// inflight is the router's record of its decisions to event-driven
	// workers until their events arrive (nil: none), folded as
	// cachestate.State.Match does.
	inflight *prefixindex.Index
	fold     cachestate.InflightMatcher
}

func (s *source) Keys(dst []uint64, _ string, _ int, _ []uint32) ([]uint64, error) {
	return append(dst, s.keys...), nil
}

func (s *source) Match(keys []uint64, w prefixindex.TierWeights, out []prefixindex.Match) []prefixindex.Match {
	start := len(out)
	out = s.events.Match(keys, w, out)
	out = s.fold.Match(s.inflight, keys, w, out, start)
	return s.approx.Match(keys, w, out)
}

// newInflight returns the in-flight record of an Oasis router over KV events
// (nil when the run has none), with the router's default bounds.
func newInflight(cfg Config) *prefixindex.Index {
	if cfg.Learning != LearnEvents || cfg.InflightTTL <= 0 || IsPeer(cfg.Policy) {
		return nil
	}
	return cachestate.NewInflightIndex(cfg.InflightTTL, cachestate.DefaultInflightWorkerBlocks, cachestate.DefaultInflightMaxBlocks, nil)
}

type flight struct {
	idx     int
	arrival int64 // when the router sent it to the worker
	// origin is when the client sent it and extra the time its first token
	// takes back to the client beyond this router (a forwarded request's
	// return trip): TTFT is first token + extra − origin.
	origin, extra int64
	prompt        int
	output        int
	end           func()
	prefill       *scoring.Prefill
	firstAt       int64 // first token, ns (0: none yet)
	peerPrefill   int64 // prompt tokens the router expected it to compute
}

type worker struct {
	idx  int32
	id   string
	sw   *scoring.Worker
	eng  *engine.Engine
	gpu  GPU
	ew   *cachestate.EventWorker
	busy bool

	prefillTime   time.Duration // step time computing or loading prompt KV
	drawTime      time.Duration // step time weighted by the step's share of full dynamic power
	seq           int64
	lastDelivered int64
	flights       map[string]*flight
	outs          []engine.Output
	evs           []kvevents.Event
	published     []*kvevents.Message // replay ring: batch seq at index seq % ReplayBuffer
	stepDur       time.Duration       // duration of the step in progress
	generated     int64               // output tokens so far
	scraped       scrapeState
	pl            peerLoad // router-side load the peer policies read
}

// scrapeState is what the router's signals.Scraper keeps per worker between
// scrapes, for the power term's tokens-per-joule signal.
type scrapeState struct {
	busy      time.Duration
	generated int64
	eff       float64 // smoothed tokens per joule; 0 until measured
	seqEff    float64 // the same per running sequence
	running   float64 // engine running count at the last scrape
}

// smooth folds sample x into the exponentially smoothed v (0: none yet), as
// the router's scraper does.
func smooth(v, x float64) float64 {
	if v == 0 {
		return x
	}
	return 0.7*v + 0.3*x
}

// ScrapeInterval is how often the simulated router reads each worker's
// generated tokens and power (oasis-router's -scrape-interval default).
const ScrapeInterval = time.Second

// ReplayBuffer is how many batches an engine keeps for replay (vLLM's
// default buffer_steps).
const ReplayBuffer = 10000

const (
	evArrival = iota
	evStepDone
	evDeliver
	evScrape
	// Federation (fed.go): a request forwarded from another datacenter, and
	// a datacenter's summary being built and arriving.
	evForward
	evSummary
	evSummaryArrive
	// Prefill/decode disaggregation (pd.go): a prompt's KV has reached its
	// decode worker.
	evTransfer
	// Autoscaling (autoscale.go): the fleet's periodic signal sample and
	// decision, and a started worker becoming routable.
	evScale
	evReady
	// Routers of one datacenter (routers.go): router w sends its load;
	// a router's message reaches the others.
	evPeers
	evPeerArrive
)

type event struct {
	t    int64 // ns
	n    uint64
	kind uint8
	dc   int8 // the datacenter whose simulation handles it
	w    int32
	idx  int32
	msg  *kvevents.Message
	sum  *summaryMsg
	pm   *peerMsg
}

// periodic reports whether e recurs for as long as anything else is left to
// simulate (it must not keep the simulation alive by itself).
func (e event) periodic() bool {
	return e.kind == evScrape || e.kind == evSummary || e.kind == evSummaryArrive || e.kind == evScale || e.kind == evPeers ||
		e.kind == evPeerArrive
}

// queue is the event queue and virtual clock shared by the datacenters of
// one simulation.
type queue struct {
	h        eventHeap
	n        uint64
	periodic int // periodic events in h
}

func (q *queue) push(e event) {
	q.n++
	e.n = q.n
	if e.periodic() {
		q.periodic++
	}
	heap.Push(&q.h, e)
}

func (q *queue) pop() event {
	e := heap.Pop(&q.h).(event)
	if e.periodic() {
		q.periodic--
	}
	return e
}

// more reports whether anything but periodic events is left.
func (q *queue) more() bool { return q.h.Len() > q.periodic }

type eventHeap []event

func (h eventHeap) Len() int { return len(h) }
func (h eventHeap) Less(i, j int) bool {
	if h[i].t != h[j].t {
		return h[i].t < h[j].t
	}
	return h[i].n < h[j].n
}
func (h eventHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *eventHeap) Push(x any)   { *h = append(*h, x.(event)) }
func (h *eventHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

type sim struct {
	cfg     Config
	reqs    []*Request
	workers []*worker
	// active are the routable workers, ws their scoring workers (same
	// order): every worker, unless an autoscaled fleet (fleet) starts and
	// drains them.
	active []*worker
	ws     []*scoring.Worker
	fleet  *fleet
	dig    *cachestate.Digester
	sel    *scoring.Selector
	scfg   scoring.Config
	src    *source
	rng    *rand.Rand
	q      *queue
	dc     int8 // this simulation's datacenter in a federation
	prefix bool // the policy reads the prefix index
	// onFinish, when set, is told of every completed request (the
	// federation's admission slots).
	onFinish func(f *flight, now int64)
	zeros    []uint32 // prompt "token ids" for the scoring: only the length is read
	peer     peer     // a peer policy (peers.go), nil for Oasis's own
	matchBuf []prefixindex.Match
	view     peerView // the decision in progress (peer policies)
	now      int64    // the arrival being routed, or the event handled, ns
	// routers are the datacenter's routers when Config.Routers > 1
	// (routers.go; nil: one, the fields above); cur is the one deciding.
	routers     []*router
	cur         int
	prefixDrops int
	// peerMessages and peerBytes are the routers' load messages (routers.go).
	peerMessages, peerBytes int64

	tpots []float64

	ttfts                     []float64
	cached, promptTok, outTok int64
	completed, rejected       int
	imbSum                    float64
	imbN                      int
	lastDone                  int64
}

func (s *sim) push(e event) {
	e.dc = s.dc
	s.q.push(e)
}

// Run simulates reqs (with keys from Keys) under cfg.
func Run(cfg Config, reqs []*Request) (Result, error) {
	start := time.Now()
	s, err := newSim(cfg, reqs, &queue{})
	if err != nil {
		return Result{}, err
	}
	if err := s.run(); err != nil {
		return Result{}, err
	}
	return s.result(time.Since(start)), nil
}

// run schedules every arrival and simulates until nothing is left.
func (s *sim) run() error {
	for i, r := range s.reqs {
		s.push(event{t: s.arrivalTime(r), kind: evArrival, idx: int32(i)})
	}
	s.startScrapes()
	if s.fleet != nil {
		s.fleet.start()
	}
	for s.q.h.Len() > 0 {
		if e := s.q.pop(); e.kind == evArrival {
			if err := s.arrive(int(e.idx), e.t); err != nil {
				return err
			}
		} else if err := s.handle(e); err != nil {
			return err
		}
	}
	return nil
}

// arrivalTime is when r arrives under the configured rate scale, ns.
func (s *sim) arrivalTime(r *Request) int64 {
	return int64(float64(r.Arrival) / s.cfg.RateScale * 1e6)
}

// newSim builds one datacenter's simulation on q; the caller schedules the
// arrivals, then startScrapes.
func newSim(cfg Config, reqs []*Request, q *queue) (*sim, error) {
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 16
	}
	if cfg.RateScale <= 0 {
		cfg.RateScale = 1
	}
	if cfg.Learning == "" {
		cfg.Learning = LearnEvents
	}
	if cfg.ApproxTTL == 0 {
		cfg.ApproxTTL = cachestate.DefaultApproxTTL
	}
	if cfg.InflightTTL == 0 {
		cfg.InflightTTL = cachestate.DefaultInflightTTL
	}
	if cfg.Model == "" {
		cfg.Model = "mooncake"
	}
	if len(cfg.GPUs) == 0 {
		return nil, fmt.Errorf("no workers")
	}
	s := &sim{cfg: cfg, reqs: reqs, q: q, rng: rand.New(rand.NewPCG(cfg.Seed, 7))}
	evIdx := prefixindex.New(prefixindex.Config{})
	apIdx := prefixindex.New(prefixindex.Config{TTL: int64(cfg.ApproxTTL)})
	s.src = &source{events: evIdx, approx: apIdx, inflight: newInflight(cfg)}
	dig := cachestate.NewDigester()

	switch cfg.Policy {
	case PolicyRandom:
	case PolicyRoundRobin:
		s.scfg = scoring.Config{Policy: scoring.RoundRobin}
	case PolicyLeastLoad:
		s.scfg = scoring.Config{Policy: scoring.LeastLoad}
	case PolicyPrefix:
		s.prefix = true
		s.scfg = scoring.Config{Policy: scoring.Weighted, Weights: map[string]float64{"prefix": 1}}
	case PolicyOasis:
		s.prefix = true
		w := cfg.Weights
		if w == nil {
			w = DefaultOasisWeights()
		}
		s.scfg = scoring.Config{Policy: scoring.Weighted, Weights: w}
	default:
		if !IsPeer(cfg.Policy) {
			return nil, fmt.Errorf("unknown policy %q", cfg.Policy)
		}
		p, err := newPeer(cfg, len(cfg.GPUs))
		if err != nil {
			return nil, err
		}
		s.peer, s.prefix = p, p.events()
	}
	var err error
	if s.sel, err = s.newSelector(s.src, cfg.Seed); err != nil {
		return nil, err
	}

	s.dig = dig
	for i, g := range cfg.GPUs {
		w, err := s.newWorker(i, g)
		if err != nil {
			return nil, err
		}
		s.workers = append(s.workers, w)
	}
	if cfg.Autoscale == nil {
		for _, w := range s.workers {
			s.active, s.ws = append(s.active, w), append(s.ws, w.sw)
		}
	} else if s.fleet, err = newFleet(s, *cfg.Autoscale); err != nil {
		return nil, err
	}
	if err := s.newRouters(); err != nil {
		return nil, err
	}
	longest := 0
	for _, r := range reqs {
		longest = max(longest, r.Input)
	}
	s.zeros = make([]uint32, longest)
	for i, r := range reqs {
		if r.keys == nil && (s.prefix || s.peer != nil) {
			return nil, fmt.Errorf("request %d has no keys: call Keys first", i)
		}
	}
	return s, nil
}

// newSelector builds a router's Selector over src: the policy's prefix
// term and the ttft term reading it. Ties break on a draw of seed, so that
// one command repeats exactly.
func (s *sim) newSelector(src *source, seed uint64) (*scoring.Selector, error) {
	term := scoring.NewPrefixTerm(src)
	switch s.cfg.Policy {
	case PolicyPrefix:
		term.LoadSlack = -1 // pure affinity
	case PolicyOasis:
		if s.cfg.LoadSlack != 0 {
			term.LoadSlack = s.cfg.LoadSlack
		}
	}
	ttft := scoring.NewTTFTTerm(term)
	if s.cfg.Policy == PolicyOasis && s.cfg.Recompute != 0 {
		ttft.Recompute = max(s.cfg.Recompute, 0)
	}
	if s.cfg.Policy == PolicyOasis && s.cfg.InflightRecompute != 0 {
		ttft.InflightRecompute = max(s.cfg.InflightRecompute, 0)
	}
	reg, err := scoring.NewRegistry(append(scoring.BuiltinTerms(), term, ttft)...)
	if err != nil {
		return nil, err
	}
	if s.cfg.Policy != PolicyRandom && s.peer == nil {
		if err := reg.Validate(s.scfg); err != nil {
			return nil, fmt.Errorf("policy: %w", err)
		}
	}
	return scoring.NewSelector(scoring.SelectorConfig{Registry: reg, TieBreak: rand.New(rand.NewPCG(seed, 11)).IntN}), nil
}

// newWorker builds worker i on GPU g: a fresh engine, router signals and
// learner, registered in the prefix index (again, for a restarted slot of an
// autoscaled fleet).
func (s *sim) newWorker(i int, g GPU) (*worker, error) {
	cfg := s.cfg
	eng, err := engine.New(engine.Config{BlockSize: cfg.BlockSize, NumGPUBlocks: g.Blocks, CPUBlocks: g.CPUBlocks, DiskBlocks: g.DiskBlocks, KVEvents: s.prefix && cfg.Learning == LearnEvents, Timing: g.Timing})
	if err != nil {
		return nil, err
	}
	id := fmt.Sprintf("w%03d", i)
	w := &worker{idx: int32(i), id: id, eng: eng, gpu: g, flights: map[string]*flight{}, lastDelivered: -1}
	w.sw = &scoring.Worker{ID: id, Model: cfg.Model, Engine: "sim", BlockSize: cfg.BlockSize, Live: scoring.NewLive()}
	if cfg.Learning == LearnEvents {
		s.src.events.RemoveWorker(id)
		_ = s.src.events.AddWorker(id, 0)
		w.ew = cachestate.NewEventWorker(id, cfg.Model, s.src.events, s.dig)
		if ix := s.src.inflight; ix != nil {
			ix.RemoveWorker(id)
			_ = ix.AddWorker(id, 0)
		}
		return w, nil
	}
	// The engine's tiers as configured: Oasis's approximate record
	// models its write-through offloading as the router does for an
	// engine advertising oasis_kv_capacity.
	s.src.approx.RemoveWorker(id)
	if err := s.src.approx.AddTieredWorker(id, prefixindex.Capacity{GPU: g.Blocks, CPU: g.CPUBlocks, Disk: g.DiskBlocks}); err != nil {
		return nil, fmt.Errorf("worker %s: %w", id, err)
	}
	return w, nil
}

// startScrapes schedules the first scrape, after the arrivals (so an arrival
// at the same instant comes first).
func (s *sim) startScrapes() { s.push(event{t: int64(ScrapeInterval), kind: evScrape}) }

// handle runs one event of this simulation other than an arrival.
func (s *sim) handle(e event) error {
	s.now = e.t
	switch e.kind {
	case evStepDone:
		s.stepDone(s.workers[e.w], e.t)
	case evScrape:
		s.scrape()
		if s.q.more() { // more to simulate: keep scraping
			s.push(event{t: e.t + int64(ScrapeInterval), kind: evScrape})
		}
	case evScale:
		s.fleet.tick(e.t)
	case evReady:
		s.fleet.ready(int(e.w), e.t)
	case evPeers:
		s.sendLoad(int(e.w), e.t)
	case evPeerArrive:
		s.receiveLoad(e.pm, e.t)
	case evDeliver:
		w := s.workers[e.w]
		m := *e.msg
		if m.Seq > w.lastDelivered+1 {
			m.Missed = m.Seq - w.lastDelivered - 1
		}
		w.lastDelivered = m.Seq
		var fetch cachestate.ReplayFunc
		if s.cfg.EventReplay {
			fetch = w.replay
		}
		return w.ew.ApplyOrReplay(m, e.t, fetch)
	}
	return nil
}

// replay serves the worker's buffered batches with seq ≥ from.
func (w *worker) replay(from int64) ([]kvevents.Message, error) {
	var out []kvevents.Message
	last := w.seq - 1
	for q := max(from, last-int64(len(w.published))+1); q <= last; q++ {
		out = append(out, *w.published[q%ReplayBuffer])
	}
	return out, nil
}

func (s *sim) arrive(idx int, now int64) error {
	s.sampleImbalance()
	s.now = now
	s.useRouter(idx)
	w, req, err := s.pick(idx)
	if err != nil {
		return err
	}
	s.submit(idx, w, req, now, now, 0)
	return nil
}

// sampleImbalance adds max/mean router in-flight over workers at an arrival.
func (s *sim) sampleImbalance() {
	total, maxIn := 0.0, 0.0
	for i, w := range s.ws {
		l := float64(w.Signals().InFlight)
		if s.routers != nil { // every router's requests
			l = float64(len(s.active[i].flights))
		}
		total += l
		maxIn = max(maxIn, l)
	}
	if total > 0 {
		s.imbSum += maxIn / (total / float64(len(s.ws)))
		s.imbN++
	}
}

// pick chooses request idx's worker under the policy; req is the scoring
// request the Selector saw (nil for random), with its prefix result.
func (s *sim) pick(idx int) (*worker, *scoring.Request, error) {
	r := s.reqs[idx]
	if s.cfg.Policy == PolicyRandom {
		return s.active[s.rng.IntN(len(s.active))], nil, nil
	}
	if s.peer != nil {
		return s.pickPeer(idx)
	}
	s.src.keys = r.keys
	// The source ignores token ids (the keys were computed by Keys); the
	// terms read the prompt's length.
	req := &scoring.Request{Model: s.cfg.Model, EstimatedTokens: int64(r.Input + r.Output),
		Tokenize: func(context.Context, *scoring.Request) ([]uint32, error) { return s.zeros[:r.Input], nil }}
	d, err := s.sel.Pick(context.Background(), s.scfg, req, s.ws)
	if err != nil {
		return nil, nil, err
	}
	return s.active[slices.Index(s.ws, d.Worker)], req, nil
}

// submit sends request idx to w at now; origin and extra as in flight. It
// reports false when the engine refused it.
func (s *sim) submit(idx int, w *worker, req *scoring.Request, now, origin, extra int64) bool {
	r := s.reqs[idx]
	var pf *scoring.Prefill
	sw := s.scoringWorker(w)
	// What the gateway does for every forwarded request: the worker's
	// prefill queue grows by the tokens the router expects it to compute.
	if req != nil {
		if n, ok := req.UncachedTokens(sw); ok {
			pf = sw.Live.StartPrefill(n)
			if s.fleet != nil {
				s.fleet.prefill += n
			}
		}
	}
	prompt := r.PromptTokens(make([]int32, 0, r.Input))
	id := strconv.Itoa(idx)
	if err := w.eng.Submit(&engine.Request{ID: id, Prompt: prompt, Output: outputTokens(idx, r.Output)}); err != nil {
		s.rejected++
		pf.Cancel()
		return false
	}
	f := &flight{idx: idx, arrival: now, origin: origin, extra: extra, prompt: r.Input, output: r.Output,
		end: sw.Live.Begin(int64(r.Input + r.Output)), prefill: pf, peerPrefill: int64(r.Input)}
	w.flights[id] = f
	s.routedPeer(w, f, now)
	if s.prefix && s.cfg.Learning == LearnApprox {
		_ = s.src.approx.Store(w.id, prefixindex.TierGPU, r.keys, now)
		s.recorded(w, r.keys)
	}
	if ix := s.src.inflight; ix != nil && req != nil {
		// cachestate.State.Record for an event-driven engine.
		_ = ix.Store(w.id, prefixindex.TierGPU, r.keys, now)
		ix.Expire(now)
	}
	if !w.busy {
		s.startStep(w, now)
	}
	return true
}

func (s *sim) startStep(w *worker, now int64) {
	res := w.eng.Step()
	if res.Duration == 0 {
		w.busy = false
		return
	}
	w.busy = true
	pre := time.Duration(res.PrefillTokens)*w.gpu.Timing.PerPrefillToken +
		time.Duration(res.LoadedTokens-res.DiskLoadedTokens)*w.gpu.Timing.PerLoadedToken +
		time.Duration(res.DiskLoadedTokens)*w.gpu.Timing.PerDiskLoadedToken
	w.prefillTime += pre
	w.drawTime += pre + time.Duration(float64(res.Duration-pre)*s.decodePower(res.DecodeSeqs))
	w.stepDur = res.Duration
	w.outs = append(w.outs[:0], res.Outputs...)
	w.evs = res.Events
	s.push(event{t: now + int64(res.Duration), kind: evStepDone, w: w.idx})
}

func (s *sim) stepDone(w *worker, now int64) {
	for _, o := range w.outs {
		f := w.flights[o.ID]
		if f == nil {
			continue
		}
		w.pl.active++
		if o.Index == 0 {
			f.firstAt = now
			w.pl.prefill -= f.peerPrefill
			f.prefill.FirstToken(time.Duration(now - f.arrival))
			s.ttfts = append(s.ttfts, float64(now+f.extra-f.origin)/1e9)
			s.cached += int64(o.CachedTokens)
			s.promptTok += int64(f.prompt)
		}
		if o.Finished {
			f.end()
			s.finishPeer(w, f, now)
			delete(w.flights, o.ID)
			s.completed++
			s.outTok += int64(f.output)
			s.lastDone = now
			if s.onFinish != nil {
				s.onFinish(f, now)
			}
			if s.fleet != nil {
				s.fleet.finished(w, f, now)
			}
		}
	}
	if len(w.evs) > 0 && w.ew != nil {
		seq := w.seq
		w.seq++
		m := &kvevents.Message{Seq: seq, Batch: kvevents.EventBatch{TS: float64(now) / 1e9, Events: w.evs}}
		if s.cfg.EventReplay {
			if len(w.published) < ReplayBuffer {
				w.published = append(w.published, m)
			} else {
				w.published[seq%ReplayBuffer] = m // ring: slot seq mod size
			}
		}
		if s.cfg.EventLoss <= 0 || s.rng.Float64() >= s.cfg.EventLoss {
			s.push(event{t: now + int64(s.cfg.EventDelay), kind: evDeliver, w: w.idx, msg: m})
		}
		w.evs = nil
	}
	w.generated += int64(len(w.outs))
	st := w.eng.Stats()
	for _, sw := range s.scoringWorkers(w) {
		sw.Live.SetEngine(float64(st.Running), float64(st.Waiting), st.KVUsage, time.Time{})
	}
	if w.eng.HasWork() {
		s.startStep(w, now)
	} else {
		w.busy = false
	}
}

// scrape does what the router's signals.Scraper does every ScrapeInterval for
// each worker: the power the worker drew over the interval (the energy model
// below: idle watts plus watts per utilisation × busy fraction), the tokens it
// generated, and a smoothed tokens-per-joule updated only when it generated
// any (an idle GPU keeps its last estimate).
func (s *sim) scrape() {
	dt := ScrapeInterval.Seconds()
	for _, w := range s.workers {
		// Steps are counted when they start, so one may run past the scrape.
		busy := min((w.drawTime - w.scraped.busy).Seconds(), dt)
		gen := w.generated - w.scraped.generated
		w.scraped.busy, w.scraped.generated = w.drawTime, w.generated
		watts := w.gpu.Power.IdleWatts + w.gpu.Power.WattsPerUtil*busy/dt
		tps := float64(gen) / dt
		running := w.sw.Signals().Running
		if tps > 0 {
			e := tps / watts
			w.scraped.eff = smooth(w.scraped.eff, e)
			w.scraped.seqEff = smooth(w.scraped.seqEff, e/max(1, (w.scraped.running+running)/2))
		}
		w.scraped.running = running
		if w.scraped.eff > 0 {
			for _, sw := range s.scoringWorkers(w) {
				sw.Live.SetPower(watts, tps, w.scraped.eff, w.scraped.seqEff)
			}
		}
	}
}

func (s *sim) result(wall time.Duration) Result {
	r := Result{
		Policy:      s.cfg.Policy,
		Workers:     len(s.workers),
		RateScale:   s.cfg.RateScale,
		Requests:    len(s.reqs),
		Completed:   s.completed,
		Rejected:    s.rejected,
		WallSeconds: wall.Seconds(),
		DecodePower: s.cfg.DecodePower,
	}
	if s.peer != nil && !s.prefix {
		r.Learning = LearnApprox
	}
	if s.prefix {
		r.Learning = s.cfg.Learning
		r.EventDelay = s.cfg.EventDelay.Seconds()
		r.EventLoss = s.cfg.EventLoss
		r.Replay = s.cfg.EventReplay && s.cfg.Learning == LearnEvents
	}
	if span := Span(s.reqs) / s.cfg.RateScale; span > 0 {
		r.Rate = float64(len(s.reqs)) / span
	}
	slices.Sort(s.ttfts)
	r.TTFTP50, r.TTFTP90, r.TTFTP99 = percentile(s.ttfts, 0.5), percentile(s.ttfts, 0.9), percentile(s.ttfts, 0.99)
	slices.Sort(s.tpots)
	if len(s.tpots) > 0 {
		r.TPOTP50, r.TPOTP90, r.TPOTP99 = percentile(s.tpots, 0.5), percentile(s.tpots, 0.9), percentile(s.tpots, 0.99)
	}
	if s.promptTok > 0 {
		r.HitRatio = float64(s.cached) / float64(s.promptTok)
	}
	r.Makespan = float64(s.lastDone) / 1e9
	if len(s.reqs) > 0 {
		r.LastArrival = float64(s.arrivalTime(s.reqs[len(s.reqs)-1])) / 1e9
	}
	if r.Makespan > 0 {
		r.Throughput = float64(s.completed) / r.Makespan
		r.OutputTokPS = float64(s.outTok) / r.Makespan
	}
	if s.imbN > 0 {
		r.Imbalance = s.imbSum / float64(s.imbN)
	}
	for _, w := range s.workers {
		idle, pre, busy := w.gpu.Power.IdleWatts*r.Makespan, w.gpu.Power.WattsPerUtil*w.prefillTime.Seconds(), w.gpu.Power.WattsPerUtil*w.drawTime.Seconds()
		r.EnergyJ += idle + busy
		r.IdleEnergyJ += idle
		r.PrefillEnergyJ += pre
		r.DecodeEnergyJ += busy - pre
		r.Preemptions += w.eng.Stats().Preemptions
		if w.ew != nil {
			r.Resyncs += w.ew.Stats().Resyncs
			r.Replays += w.ew.Stats().Replays
		}
	}
	if s.outTok > 0 {
		r.JoulesPerToken = r.EnergyJ / float64(s.outTok)
	}
	s.routersResult(&r)
	if math.IsNaN(r.TTFTP90) {
		r.TTFTP50, r.TTFTP90, r.TTFTP99 = 0, 0, 0
	}
	return r
}
