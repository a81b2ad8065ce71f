package cluster

import (
	"fmt"
	"time"

	"github.com/oasis-llm/oasis/sim/engine"
)

// KVModel is the attention shape that sets how many bytes of KV cache one
// token takes, hence what a prefill/decode transfer moves.
type KVModel struct {
	Name       string
	Layers     int
	KVHeads    int
	HeadDim    int
	DTypeBytes int
}

// BytesPerToken is K and V for every layer and KV head.
func (m KVModel) BytesPerToken() int64 {
	return int64(2 * m.Layers * m.KVHeads * m.HeadDim * m.DTypeBytes)
}

// Llama3_8B is the model oasis-sim's step-time model describes (BF16, GQA
// with 8 KV heads): 128 KiB per token.
func Llama3_8B() KVModel {
	return KVModel{Name: "Llama-3-8B BF16", Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}
}

// DefaultLinkGBps is the default KV transfer bandwidth per GPU, GB/s: one
// 400 Gb/s ConnectX-7 NIC per GPU (a DGX H100's compute fabric) is 50 GB/s
// of line rate; NIXL over RDMA (UCX) reaches about 80% of it for large
// transfers.
const DefaultLinkGBps = 40

// SLO is one pair of DistServe-style per-request targets: a request meets it
// when its TTFT and its TPOT are both within them.
type SLO struct {
	TTFT time.Duration
	TPOT time.Duration
}

func (o SLO) String() string { return fmt.Sprintf("%v/%v", o.TTFT, o.TPOT) }

// DefaultSLOs are judged in every run: TTFT ≤ 2 s (the repository's routing
// SLO, sized for the trace's ~12k-token prompts) with DistServe's chatbot TPOT
// SLO of 100 ms, and the same TTFT with a tight TPOT of 25 ms, about 4× the
// unloaded 6 ms decode step of the simulated GPU, where interference from
// prompts shows.
func DefaultSLOs() []SLO {
	return []SLO{{2 * time.Second, 100 * time.Millisecond}, {2 * time.Second, 25 * time.Millisecond}}
}

// PDConfig is one prefill/decode simulation: Workers identical GPUs, the
// first Prefill of them prefill-only and the rest decode-only, or all of them
// serving both (aggregated) when Prefill is 0.
type PDConfig struct {
	GPU       GPU
	Workers   int
	Prefill   int // 0: aggregated
	RateScale float64
	// LinkGBps is each GPU's NIC bandwidth for KV transfers, GB/s (10^9).
	LinkGBps float64
	KV       KVModel
	SLOs     []SLO // default DefaultSLOs
	// MaxBatchedTokens is every engine's token budget per step (vLLM
	// --max-num-batched-tokens, the chunked-prefill chunk); 0: the engine's
	// default, 8192.
	MaxBatchedTokens int
	BlockSize        int
}

// Split names the configuration: "agg" or "xPyD".
func (c PDConfig) Split() string {
	if c.Prefill == 0 {
		return "agg"
	}
	return fmt.Sprintf("%dP%dD", c.Prefill, c.Workers-c.Prefill)
}

func (c *PDConfig) fill() error {
	if c.GPU.Blocks == 0 {
		c.GPU = H100
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.RateScale <= 0 {
		c.RateScale = 1
	}
	if c.LinkGBps <= 0 {
		c.LinkGBps = DefaultLinkGBps
	}
	if c.KV.Layers == 0 {
		c.KV = Llama3_8B()
	}
	if len(c.SLOs) == 0 {
		c.SLOs = DefaultSLOs()
	}
	if c.Workers < 1 || c.Prefill < 0 || (c.Prefill > 0 && c.Prefill >= c.Workers) {
		return fmt.Errorf("split %d prefill of %d workers: need 0 (aggregated) or 1..workers-1", c.Prefill, c.Workers)
	}
	return nil
}

// PDResult is one run's measurements. Latencies are in seconds.
type PDResult struct {
	Split     string  `json:"split"`
	Prefill   int     `json:"prefill_workers"`
	Decode    int     `json:"decode_workers"`
	RateScale float64 `json:"rate_scale"`
	Rate      float64 `json:"rate_rps"`
	Requests  int     `json:"requests"`
	Completed int     `json:"completed"`

	TTFTP50 float64 `json:"ttft_p50_s"`
	TTFTP90 float64 `json:"ttft_p90_s"`
	TTFTP99 float64 `json:"ttft_p99_s"`
	// TPOT is per request: (last token − first token) / (output − 1), over
	// requests with more than one output token.
	TPOTP50 float64 `json:"tpot_p50_s"`
	TPOTP90 float64 `json:"tpot_p90_s"`
	TPOTP99 float64 `json:"tpot_p99_s"`
	// SLO is the outcome under each of the configuration's SLOs, in order.
	SLO        []SLOResult `json:"slo"`
	Throughput float64     `json:"throughput_rps"`
	Makespan   float64     `json:"makespan_s"`
	HitRatio   float64     `json:"hit_ratio"`
	// Transfers (disaggregated only): time from the end of prefill to the KV
	// on the decode worker, NIC queueing included, and bytes moved.
	XferP50   float64 `json:"xfer_p50_s,omitempty"`
	XferP90   float64 `json:"xfer_p90_s,omitempty"`
	XferBytes float64 `json:"xfer_bytes,omitempty"`
	// DecodeRecompute is prompt tokens decode workers computed beyond the one
	// per request that produces the first token's logits (recompute after a
	// preemption).
	DecodeRecompute int64   `json:"decode_recompute_tokens,omitempty"`
	Preemptions     uint64  `json:"preemptions"`
	WallSeconds     float64 `json:"wall_s"`
}

// SLOResult is one run judged against one SLO: Attainment is the share of
// requests meeting both targets, Goodput those requests per second of
// (scaled) trace time.
type SLOResult struct {
	TTFT       float64 `json:"ttft_slo_s"`
	TPOT       float64 `json:"tpot_slo_s"`
	Attainment float64 `json:"attainment"`
	Goodput    float64 `json:"goodput_rps"`
}

type pdRole uint8

const (
	roleBoth pdRole = iota
	rolePrefill
	roleDecode
)

// pdWorker is one GPU and the router's view of it.
type pdWorker struct {
	idx  int32
	role pdRole
	eng  *engine.Engine
	busy bool
	outs []engine.Output

	// Router state, updated on routing and on completions.
	pending  int64 // uncached prompt tokens routed here, not yet computed
	active   int64 // tokens of requests routed here and still in flight
	inflight int

	txFree, rxFree int64 // when the NIC's send / receive side is next free, ns

	promptComputed int64 // prompt tokens its steps computed
	generated      int64 // output tokens its steps produced
	remote         int   // RemotePrefill requests submitted to it
}

// pdFlight is one request's progress.
type pdFlight struct {
	prompt      []int32 // while in flight
	p, d        int32   // prefill and decode worker (the same when aggregated)
	uncached    int64
	arrival     int64
	first, last int64
	tokens      int
	done        int // completions seen (must end at 1)
}

// reqLatency is one completed request's TTFT and TPOT (-1: one output
// token, no TPOT).
type reqLatency struct{ ttft, tpot time.Duration }

type pdSim struct {
	cfg             PDConfig
	reqs            []*Request
	workers         []*pdWorker
	prefill, decode []*pdWorker // decode is nil when aggregated
	flights         []pdFlight
	q               *queue
	hashes          []uint64

	ttfts, tpots, xfers []float64
	lat                 []reqLatency // per completed request
	cached, promptTok   int64
	xferBytes           float64
	completed           int
	lastDone            int64
}

// RunPD simulates reqs on an aggregated or disaggregated cluster.
func RunPD(cfg PDConfig, reqs []*Request) (PDResult, error) {
	start := time.Now()
	s, err := runPD(cfg, reqs)
	if err != nil {
		return PDResult{}, err
	}
	return s.result(time.Since(start)), nil
}

func runPD(cfg PDConfig, reqs []*Request) (*pdSim, error) {
	s, err := newPDSim(cfg, reqs)
	if err != nil {
		return nil, err
	}
	for i, r := range reqs {
		s.q.push(event{t: int64(float64(r.Arrival) / s.cfg.RateScale * 1e6), kind: evArrival, idx: int32(i)})
	}
	for s.q.h.Len() > 0 {
		e := s.q.pop()
		switch e.kind {
		case evArrival:
			err = s.arrive(int(e.idx), e.t)
		case evStepDone:
			s.stepDone(s.workers[e.w], e.t)
		case evTransfer:
			err = s.transferred(int(e.idx), e.t)
		}
		if err != nil {
			return nil, err
		}
	}
	return s, nil
}

func newPDSim(cfg PDConfig, reqs []*Request) (*pdSim, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &pdSim{cfg: cfg, reqs: reqs, flights: make([]pdFlight, len(reqs)), q: &queue{}}
	for i := range cfg.Workers {
		eng, err := engine.New(engine.Config{BlockSize: cfg.BlockSize, NumGPUBlocks: cfg.GPU.Blocks, MaxNumBatchedTokens: cfg.MaxBatchedTokens, Timing: cfg.GPU.Timing})
		if err != nil {
			return nil, err
		}
		w := &pdWorker{idx: int32(i), eng: eng}
		switch {
		case cfg.Prefill == 0:
			s.prefill = append(s.prefill, w)
		case i < cfg.Prefill:
			w.role = rolePrefill
			s.prefill = append(s.prefill, w)
		default:
			w.role = roleDecode
			s.decode = append(s.decode, w)
		}
		s.workers = append(s.workers, w)
	}
	return s, nil
}
