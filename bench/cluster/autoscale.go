package cluster

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// AutoscaleConfig is an autoscaled fleet: Config.GPUs are its slots (the most
// engines it may run), Scaler decides how many run, and every engine started
// is a fresh one (empty KV cache, learned rates reset) that serves only after
// ColdStart. An engine removed is drained: the router stops sending to it at
// once and it is stopped (and no longer billed) when its last request ends,
// as the llm driver's drain does (nomad-driver/driver/drain.go).
type AutoscaleConfig struct {
	Scaler Scaler
	// Initial engines serve from the start; Min is the fewest the fleet keeps
	// (at least 1).
	Initial, Min int
	// ColdStart is the time from the decision to an engine serving: Nomad
	// placing it, the engine loading weights, its health check passing.
	ColdStart time.Duration
	// Tick is how often the fleet's signals are sampled and the scaler asked
	// (default 1 s: the autoscaler's Prometheus range queries step 1 s).
	Tick time.Duration
	// SLO a request is judged against for attainment (its own TTFT and TPOT).
	SLO RoutingSLO
}

// Scaler decides the fleet size from its signals.
type Scaler interface {
	// Decide returns the engine count wanted now; h holds every sample so
	// far, the latest last. The fleet clamps it to [Min, slots].
	Decide(h *History) int
}

// Sample is the fleet's signals at one tick: what the router exports as its
// scaling signals (observability/README.md "Scaling signals").
type Sample struct {
	At       time.Duration
	Engines  int     // starting + serving
	Serving  int     // routable
	InFlight int64   // the router's in-flight requests on them
	TTFTP90  float64 // 90th percentile of their estimated TTFT, s
	TTFTP50  float64 // its median
	Arrivals int     // requests that arrived since the previous tick
	// PrefillTokens is the uncached prompt tokens the router sent to engines
	// since the previous tick (what it expects them to prefill).
	PrefillTokens int64
	// PrefillRate is the median over serving engines of the prefill rate the
	// router learned for each, tokens/s.
	PrefillRate float64
}

// History is the samples so far, oldest first.
type History struct{ Samples []Sample }

// Last returns the latest sample.
func (h *History) Last() Sample { return h.Samples[len(h.Samples)-1] }

// Window returns the samples of the last d (the latest included).
func (h *History) Window(d time.Duration) []Sample {
	if len(h.Samples) == 0 {
		return nil
	}
	from := h.Last().At - d
	i, _ := slices.BinarySearchFunc(h.Samples, from, func(s Sample, t time.Duration) int {
		return int((s.At - t) / time.Microsecond)
	})
	return h.Samples[i:]
}

// AutoscaleResult is what an autoscaled (or static) fleet cost and served.
type AutoscaleResult struct {
	Scaler    string  `json:"scaler"`
	GPUHours  float64 `json:"gpu_hours"`
	Requests  int     `json:"requests"`
	Attained  int     `json:"attained"`   // requests meeting both TTFT and TPOT
	Attain    float64 `json:"attainment"` // Attained / Requests
	TTFTP90   float64 `json:"ttft_p90_s"`
	TPOTP90   float64 `json:"tpot_p90_s"`
	MaxEngine int     `json:"max_engines"`
	MinEngine int     `json:"min_engines"`
	ScaleOuts int     `json:"scale_outs"`
	ScaleIns  int     `json:"scale_ins"`
	Makespan  float64 `json:"makespan_s"`
	// Engines is the engine count (starting + serving) every minute.
	Engines []int `json:"engines_per_minute"`
}

type slotState uint8

const (
	slotStopped slotState = iota
	slotStarting
	slotServing
	slotDraining
)

// fleet runs AutoscaleConfig over a sim's workers.
type fleet struct {
	s        *sim
	cfg      AutoscaleConfig
	state    []slotState
	since    []int64 // when each slot's billing started, ns
	billed   int64   // ns of engine time of stopped engines
	hist     History
	arrivals []int64 // every arrival, ns, ascending
	next     int     // arrivals before it were counted
	prefill  int64   // uncached prompt tokens sent since the last tick
	res      AutoscaleResult
}

func newFleet(s *sim, cfg AutoscaleConfig) (*fleet, error) {
	n := len(s.workers)
	cfg.Min = max(cfg.Min, 1)
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.Scaler == nil || cfg.Initial < cfg.Min || cfg.Initial > n || cfg.Min > n {
		return nil, fmt.Errorf("autoscale: need a scaler and min %d ≤ initial %d ≤ slots %d", cfg.Min, cfg.Initial, n)
	}
	f := &fleet{s: s, cfg: cfg, state: make([]slotState, n), since: make([]int64, n)}
	for _, r := range s.reqs {
		f.arrivals = append(f.arrivals, s.arrivalTime(r))
	}
	slices.Sort(f.arrivals)
	for i := range cfg.Initial {
		f.state[i] = slotServing
		f.s.active, f.s.ws = append(f.s.active, s.workers[i]), append(f.s.ws, s.workers[i].sw)
	}
	f.res.MinEngine = cfg.Initial
	return f, nil
}

func (f *fleet) start() { f.s.push(event{t: int64(f.cfg.Tick), kind: evScale}) }

// tick samples the signals, asks the scaler and applies its answer.
func (f *fleet) tick(now int64) {
	smp := Sample{At: time.Duration(now)}
	for f.next < len(f.arrivals) && f.arrivals[f.next] <= now {
		f.next++
		smp.Arrivals++
	}
	ttfts := make([]float64, 0, len(f.s.ws))
	rates := make([]float64, 0, len(f.s.ws))
	for _, w := range f.s.ws {
		sig := w.Signals()
		smp.InFlight += sig.InFlight
		ttfts = append(ttfts, sig.EstimatedTTFT(0).Seconds())
		rates = append(rates, sig.PrefillRate)
	}
	slices.Sort(ttfts)
	slices.Sort(rates)
	if len(ttfts) > 0 {
		smp.TTFTP90, smp.TTFTP50 = percentile(ttfts, 0.9), percentile(ttfts, 0.5)
		smp.PrefillRate = percentile(rates, 0.5)
	}
	smp.PrefillTokens, f.prefill = f.prefill, 0
	smp.Serving = len(f.s.ws)
	smp.Engines = f.count(slotStarting) + smp.Serving
	f.hist.Samples = append(f.hist.Samples, smp)
	if now%int64(time.Minute) < int64(f.cfg.Tick) {
		f.res.Engines = append(f.res.Engines, smp.Engines)
	}
	want := min(max(f.cfg.Scaler.Decide(&f.hist), f.cfg.Min), len(f.state))
	switch {
	case want > smp.Engines:
		f.res.ScaleOuts++
		for range want - smp.Engines {
			f.launch(now)
		}
	case want < smp.Engines:
		f.res.ScaleIns++
		for range smp.Engines - want {
			f.remove(now)
		}
	}
	engines := f.count(slotStarting) + len(f.s.ws)
	f.res.MaxEngine, f.res.MinEngine = max(f.res.MaxEngine, engines), min(f.res.MinEngine, engines)
	if f.s.q.more() {
		f.s.push(event{t: now + int64(f.cfg.Tick), kind: evScale})
	}
}

func (f *fleet) count(st slotState) int {
	n := 0
	for _, s := range f.state {
		if s == st {
			n++
		}
	}
	return n
}

// launch starts a fresh engine in a stopped slot; it serves after ColdStart.
func (f *fleet) launch(now int64) {
	i := slices.Index(f.state, slotStopped)
	if i < 0 {
		return
	}
	w, err := f.s.newWorker(i, f.s.cfg.GPUs[i])
	if err != nil {
		panic(fmt.Sprintf("autoscale: restarting worker %d: %v", i, err)) // the same config built it once
	}
	f.s.workers[i] = w
	f.state[i], f.since[i] = slotStarting, now
	f.s.push(event{t: now + int64(f.cfg.ColdStart), kind: evReady, w: int32(i)})
}

// ready makes a started engine routable.
func (f *fleet) ready(i int, _ int64) {
	if f.state[i] != slotStarting {
		return // cancelled while starting
	}
	f.state[i] = slotServing
	f.s.active, f.s.ws = append(f.s.active, f.s.workers[i]), append(f.s.ws, f.s.workers[i].sw)
}

// remove takes one engine away: one still starting if any, else the serving
// engine with the fewest requests in flight, drained; never the last one.
func (f *fleet) remove(now int64) {
	if i := slices.Index(f.state, slotStarting); i >= 0 {
		f.stop(i, now)
		return
	}
	if len(f.s.active) <= 1 {
		return
	}
	best := 0
	for j, w := range f.s.active {
		if len(w.flights) < len(f.s.active[best].flights) {
			best = j
		}
	}
	w := f.s.active[best]
	f.s.active = slices.Delete(f.s.active, best, best+1)
	f.s.ws = slices.Delete(f.s.ws, best, best+1)
	f.state[w.idx] = slotDraining
	if len(w.flights) == 0 {
		f.stop(int(w.idx), now)
	}
}

func (f *fleet) stop(i int, now int64) {
	f.billed += now - f.since[i]
	f.state[i] = slotStopped
}

// finished judges a completed request and stops a drained engine.
func (f *fleet) finished(w *worker, fl *flight, now int64) {
	f.res.Requests++
	ttft := float64(fl.firstAt+fl.extra-fl.origin) / 1e9
	tpot := 0.0
	if fl.output > 1 {
		tpot = float64(now-fl.firstAt) / 1e9 / float64(fl.output-1)
	}
	if ttft <= f.cfg.SLO.TTFTP90 && tpot <= f.cfg.SLO.TPOTP90 {
		f.res.Attained++
	}
	if f.state[w.idx] == slotDraining && len(w.flights) == 0 && f.s.workers[w.idx] == w {
		f.stop(int(w.idx), now)
	}
}

// result closes the billing at the end of the simulation.
func (f *fleet) result(r Result) AutoscaleResult {
	end := f.s.lastDone
	billed := f.billed
	for i, st := range f.state {
		if st != slotStopped {
			billed += max(end-f.since[i], 0)
		}
	}
	out := f.res
	out.GPUHours = float64(billed) / 1e9 / 3600
	if out.Requests > 0 {
		out.Attain = float64(out.Attained) / float64(out.Requests)
	}
	out.TTFTP90, out.TPOTP90, out.Makespan = r.TTFTP90, r.TPOTP90, r.Makespan
	return out
}

// RunAutoscaled simulates reqs with cfg.Autoscale set and returns both the
// routing result and the fleet's.
func RunAutoscaled(cfg Config, reqs []*Request) (Result, AutoscaleResult, error) {
	if cfg.Autoscale == nil {
		return Result{}, AutoscaleResult{}, fmt.Errorf("autoscale: no AutoscaleConfig")
	}
	start := time.Now()
	s, err := newSim(cfg, reqs, &queue{})
	if err != nil {
		return Result{}, AutoscaleResult{}, err
	}
	if s.peer != nil {
		return Result{}, AutoscaleResult{}, fmt.Errorf("autoscale: peer policy %s reads every worker; use an Oasis policy", cfg.Policy)
	}
	if err := s.run(); err != nil {
		return Result{}, AutoscaleResult{}, err
	}
	r := s.result(time.Since(start))
	return r, s.fleet.result(r), nil
}

// Diurnal re-times reqs (sorted by arrival) as one day compressed into day:
// arrivals follow the rate λ(t) ∝ 1 + amp·sin(2πt/day − π/2), lowest at the
// start and end, highest at midday, keeping the trace's order (its sessions
// and prefixes). It returns copies; the originals keep their times.
func Diurnal(reqs []*Request, day time.Duration, amp float64) []*Request {
	n := len(reqs)
	out := make([]*Request, n)
	T := day.Seconds()
	// Λ(t) = t − amp·T/(2π)·sin(2πt/T) grows from 0 to T: invert by bisection.
	cum := func(t float64) float64 { return t - amp*T/(2*math.Pi)*math.Sin(2*math.Pi*t/T) }
	for i, r := range reqs {
		target := T * (float64(i) + 0.5) / float64(n)
		lo, hi := 0.0, T
		for range 50 {
			mid := (lo + hi) / 2
			if cum(mid) < target {
				lo = mid
			} else {
				hi = mid
			}
		}
		c := *r
		c.Arrival = int64(lo * 1000)
		out[i] = &c
	}
	return out
}

// Repeat returns reqs (sorted by arrival) n times in a row, each copy after
// the previous one's last arrival: the same sessions and prefixes again, for
// a longer day at the same load.
func Repeat(reqs []*Request, n int) []*Request {
	if n <= 1 || len(reqs) == 0 {
		return reqs
	}
	span := reqs[len(reqs)-1].Arrival - reqs[0].Arrival + 1
	out := make([]*Request, 0, n*len(reqs))
	for k := range n {
		for _, r := range reqs {
			c := *r
			c.Arrival += int64(k) * span
			out = append(out, &c)
		}
	}
	return out
}
