package cluster

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/oasis-llm/oasis/router/federation"
	"github.com/oasis-llm/oasis/router/policy"
)

// Federation policies: where a request that arrives in one datacenter is
// served.
const (
	FedLocal      = "local"       // never forward
	FedBestPrefix = "best-prefix" // to the datacenter whose summary shows the longest prefix, ignoring load
	FedOasis      = "oasis"       // federation.Decide over the summaries, with the spill budget
)

// FedPolicies lists them in report order.
var FedPolicies = []string{FedLocal, FedBestPrefix, FedOasis}

// BytesPerToken is the prompt text per token a forwarded request carries
// across the WAN (English text under a BPE tokenizer): the simulator counts
// tokens, the WAN carries the request body.
const BytesPerToken = 4

// FedConfig is one simulation of several datacenters.
type FedConfig struct {
	// Config is every datacenter's own simulation: GPUs are one
	// datacenter's workers, Policy routes among them, RateScale scales the
	// whole trace.
	Config
	DCs int           // datacenters (≥ 2)
	RTT time.Duration // round trip between any two datacenters
	// Skew is the share of arrivals at dc1; the others share the rest
	// evenly. ShiftPeriod, when set, swings dc1's share from Skew to
	// 1 − Skew and back over that much trace time (a diurnal shift).
	Skew        float64
	ShiftPeriod time.Duration
	Federation  string
	// Settings are the oasis policy's federation section (Enabled is
	// forced on); the zero value means policy.DefaultFederation.
	Settings policy.FederationSettings
	// MaxInFlight is each datacenter's admission cap for the model (the
	// gateway's max_in_flight); 0 is uncapped, and then the router's
	// queue-wait estimate is always 0. Admission's queue is unbounded, so
	// local admission is never saturated (it waits instead).
	MaxInFlight int
	HotKeys     int // prefix block keys a summary's filter holds; 0: the router's 1024
}

// FedResult is one federated run: Result merges every datacenter's requests.
type FedResult struct {
	Result
	Federation string  `json:"federation"`
	DCs        int     `json:"dcs"`
	RTT        float64 `json:"rtt_s"`
	Skew       float64 `json:"skew"`
	Shift      float64 `json:"shift_period_s,omitempty"`
	// Forwarded requests crossed the WAN; EgressBytes is their prompts'
	// text (BytesPerToken), SummaryBytes the encoded summaries pushed.
	Forwarded    int     `json:"forwarded"`
	ForwardedPct float64 `json:"forwarded_pct"`
	EgressBytes  int64   `json:"egress_prompt_bytes"`
	SummaryBytes int64   `json:"egress_summary_bytes"`
	// Arrivals and Served count requests per datacenter (by arrival, by
	// where they ran).
	Arrivals []int `json:"arrivals"`
	Served   []int `json:"served"`
}

// summaryMsg is a summary on its way to another datacenter.
type summaryMsg struct {
	from int
	sum  federation.ModelSummary
}

// dcState is one datacenter: its simulation and what its router keeps for
// federation.
type dcState struct {
	i        int
	name     string
	s        *sim
	spill    federation.SpillBudget
	hot      *federation.HotKeys
	peers    map[int]peerSummary // the latest summary from each other datacenter
	waiting  []int               // admission queue (request indexes)
	inflight int
	svcMean  time.Duration // mean admitted request duration (the gateway's serviceTimes)
	arrivals int
}

type peerSummary struct {
	sum      federation.ModelSummary
	received int64
}

type fed struct {
	cfg       FedConfig
	set       policy.FederationSettings
	dcs       []*dcState
	forwarded []bool // per request: it arrived from another datacenter
	nFwd      int
	egress    int64
	sumBytes  int64
	err       error // from a callback that cannot return it
}

// RunFederated simulates reqs (with keys from Keys) arriving in cfg.DCs
// datacenters under cfg.Federation, on one virtual clock.
func RunFederated(cfg FedConfig, reqs []*Request) (FedResult, error) {
	start := time.Now()
	if cfg.DCs < 2 {
		return FedResult{}, fmt.Errorf("federation needs 2 or more datacenters, not %d", cfg.DCs)
	}
	if cfg.Skew < 0 || cfg.Skew > 1 {
		return FedResult{}, fmt.Errorf("skew %g outside [0, 1]", cfg.Skew)
	}
	if !slices.Contains(FedPolicies, cfg.Federation) {
		return FedResult{}, fmt.Errorf("unknown federation policy %q", cfg.Federation)
	}
	f := &fed{cfg: cfg, set: cfg.Settings, forwarded: make([]bool, len(reqs))}
	if f.set == (policy.FederationSettings{}) {
		f.set = policy.DefaultFederation()
	}
	f.set.Enabled = true
	if cfg.HotKeys <= 0 {
		cfg.HotKeys = 1024
	}
	q := &queue{}
	for i := range cfg.DCs {
		c := cfg.Config
		c.Seed += uint64(i)
		s, err := newSim(c, reqs, q)
		if err != nil {
			return FedResult{}, err
		}
		s.dc = int8(i)
		d := &dcState{i: i, name: fmt.Sprintf("dc%d", i+1), s: s, hot: federation.NewHotKeys(cfg.HotKeys),
			peers: map[int]peerSummary{}, svcMean: time.Second}
		s.onFinish = func(fl *flight, now int64) { f.finished(d, fl, now) }
		f.dcs = append(f.dcs, d)
	}
	for i, r := range reqs {
		d := f.dcs[f.origin(i, r)]
		d.arrivals++
		d.s.push(event{t: d.s.arrivalTime(r), kind: evArrival, idx: int32(i)})
	}
	for _, d := range f.dcs {
		d.s.startScrapes()
		d.s.push(event{t: int64(ScrapeInterval), kind: evSummary})
	}
	for q.h.Len() > 0 && f.err == nil {
		if err := f.handle(q.pop()); err != nil {
			return FedResult{}, err
		}
	}
	if f.err != nil {
		return FedResult{}, f.err
	}
	return f.result(time.Since(start)), nil
}

// origin is the datacenter request i arrives in: dc1 with the skew's share
// at its trace time, else one of the others, by a fixed hash of i.
func (f *fed) origin(i int, r *Request) int {
	p := f.cfg.Skew
	if f.cfg.ShiftPeriod > 0 {
		phase := 2 * math.Pi * float64(r.Arrival) / float64(f.cfg.ShiftPeriod.Milliseconds())
		p = 0.5 + (p-0.5)*math.Cos(phase)
	}
	u := float64(mix(uint64(i)^0x5eed)>>11) / (1 << 53)
	if u < p {
		return 0
	}
	return 1 + int((u-p)/(1-p)*float64(f.cfg.DCs-1))%(f.cfg.DCs-1)
}

func (f *fed) handle(e event) error {
	d := f.dcs[e.dc]
	switch e.kind {
	case evArrival, evForward:
		return f.arrive(d, int(e.idx), e.t)
	case evSummary:
		f.pushSummary(d, e.t)
		if d.s.q.more() {
			d.s.push(event{t: e.t + int64(ScrapeInterval), kind: evSummary})
		}
	case evSummaryArrive:
		d.peers[e.sum.from] = peerSummary{sum: e.sum.sum, received: e.t}
	default:
		return d.s.handle(e)
	}
	return nil
}

// vtime is the virtual clock as the router's guards read time.
func vtime(ns int64) time.Time { return time.Unix(0, ns) }

// result merges the datacenters' measurements into one Result.
func (f *fed) result(wall time.Duration) FedResult {
	d0 := f.dcs[0].s
	m := &sim{cfg: d0.cfg, reqs: d0.reqs, prefix: d0.prefix}
	r := FedResult{Federation: f.cfg.Federation, DCs: f.cfg.DCs, RTT: f.cfg.RTT.Seconds(), Skew: f.cfg.Skew,
		Shift: f.cfg.ShiftPeriod.Seconds(), Forwarded: f.nFwd, EgressBytes: f.egress, SummaryBytes: f.sumBytes}
	for _, d := range f.dcs {
		s := d.s
		m.workers = append(m.workers, s.workers...)
		m.ttfts = append(m.ttfts, s.ttfts...)
		m.cached, m.promptTok, m.outTok = m.cached+s.cached, m.promptTok+s.promptTok, m.outTok+s.outTok
		m.completed, m.rejected = m.completed+s.completed, m.rejected+s.rejected
		m.imbSum, m.imbN = m.imbSum+s.imbSum, m.imbN+s.imbN
		m.lastDone = max(m.lastDone, s.lastDone)
		r.Arrivals = append(r.Arrivals, d.arrivals)
		r.Served = append(r.Served, s.completed)
	}
	r.Result = m.result(wall)
	if len(d0.reqs) > 0 {
		r.ForwardedPct = 100 * float64(f.nFwd) / float64(len(d0.reqs))
	}
	return r
}
