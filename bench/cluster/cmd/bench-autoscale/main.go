// Command bench-autoscale is `make bench-autoscale`: the cluster simulator on one day of a trace
// (its requests re-timed to a day-shaped rate, cluster.Diurnal) with three fleets of H100
// engines: static and sized for the peak, the recipes' shipped autoscaling policy
// (cluster.ThresholdScaler) and a Dynamo-Planner-like one (cluster.PlannerScaler). It prints
// GPU-hours and SLO attainment of each and writes bench/out/autoscale.json.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/oasis-llm/oasis/bench/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-autoscale:", err)
		os.Exit(1)
	}
}

type options struct {
	trace               string
	limit, slots        int
	day, coldStart      time.Duration
	amp, target, attain float64
	sloTTFT, sloTPOT    float64
	outDir              string
	adjust              time.Duration
	ttftFactor          float64
	p90                 bool
	static              int
	repeat              int
	trigger             int
	outPercent          float64
	shippedOnly         bool
	plannerOnly         bool
	headroom            float64
}

func parse() options {
	var o options
	flag.StringVar(&o.trace, "trace", "mooncake-conversation", "trace: a library name or a file in the Mooncake JSONL format")
	flag.IntVar(&o.limit, "limit", 0, "use only the first N requests (0: all)")
	flag.IntVar(&o.repeat, "repeat", 1, "replay the trace this many times in a row within the day (a longer day at the same load)")
	flag.IntVar(&o.slots, "slots", 24, "most engines any fleet may run (H100s)")
	flag.DurationVar(&o.day, "day", 2*time.Hour, "the day the trace is re-timed to (virtual time)")
	flag.Float64Var(&o.amp, "amp", 0.8, "day shape: rate ∝ 1 + amp·sin(2πt/day − π/2) (trough at the ends, peak at midday)")
	flag.DurationVar(&o.coldStart, "cold-start", time.Minute, "an engine's start: placement, weights, health check")
	flag.Float64Var(&o.target, "target-in-flight", 48, "shipped policy: in-flight requests per engine it sizes for (the GPU recipes' target_in_flight)")
	flag.Float64Var(&o.sloTTFT, "slo-ttft", 2, "SLO: a request's TTFT, s")
	flag.Float64Var(&o.sloTPOT, "slo-tpot", 0.1, "SLO: a request's TPOT, s")
	flag.Float64Var(&o.attain, "static-attainment", 0.995, "the static fleet is the smallest whose attainment reaches this share of the attainment of -slots engines (some requests miss the SLO on any fleet: prompts too long for the TTFT SLO)")
	flag.DurationVar(&o.adjust, "planner-interval", time.Minute, "planner: adjustment interval")
	flag.Float64Var(&o.ttftFactor, "ttft-factor", 0.5, "shipped policy: scale out when the TTFT estimate reaches this share of the SLO")
	flag.BoolVar(&o.p90, "ttft-p90", false, "shipped policy: read the p90 of the TTFT estimates over engines instead of the median (what the recipes read)")
	flag.IntVar(&o.static, "static-engines", 0, "the static fleet's size (0: the smallest meeting -static-attainment, found by bisection)")
	flag.IntVar(&o.trigger, "out-trigger", 5, "shipped policy: samples of the 30 s window a scale-out check needs in bounds (within_bounds_trigger)")
	flag.Float64Var(&o.outPercent, "out-percent", 50, "shipped policy: growth of a scale-out, %")
	flag.BoolVar(&o.shippedOnly, "shipped-only", false, "run only the shipped policy (tuning; compare with an earlier run's static fleet)")
	flag.BoolVar(&o.plannerOnly, "planner-only", false, "run only the planner, its capacity from -static-engines (tuning)")
	flag.Float64Var(&o.headroom, "planner-headroom", 1, "planner: multiply the predicted rate (1: none, as Dynamo's planner)")
	flag.StringVar(&o.outDir, "out", "bench/out", "directory for autoscale.json")
	flag.Parse()
	return o
}

// report is autoscale.json.
type report struct {
	Trace        string                    `json:"trace"`
	Requests     int                       `json:"requests"`
	Repeat       int                       `json:"repeat"`
	Day          string                    `json:"day"`
	Amp          float64                   `json:"amp"`
	PeakRate     float64                   `json:"peak_rate_rps"`
	SLO          cluster.RoutingSLO        `json:"slo"`
	ColdStart    string                    `json:"cold_start"`
	StaticSizing map[int]float64           `json:"static_sizing_attainment"`
	Fleets       []cluster.AutoscaleResult `json:"fleets"`
}

func run() error {
	o := parse()
	reqs, err := cluster.LoadSpec(o.trace)
	if err != nil {
		return err
	}
	if o.limit > 0 && o.limit < len(reqs) {
		reqs = reqs[:o.limit]
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].Arrival < reqs[j].Arrival })
	if err := cluster.Keys(reqs, "mooncake", 16); err != nil {
		return err
	}
	reqs = cluster.Diurnal(cluster.Repeat(reqs, o.repeat), o.day, o.amp)
	slo := cluster.RoutingSLO{TTFTP90: o.sloTTFT, TPOTP90: o.sloTPOT}
	rep := report{Trace: o.trace, Requests: len(reqs), Repeat: o.repeat, Day: o.day.String(), Amp: o.amp, SLO: slo,
		ColdStart: o.coldStart.String(), PeakRate: peakRate(reqs, time.Minute), StaticSizing: map[int]float64{}}
	fmt.Fprintf(os.Stderr, "%d requests over a %s day, peak %.2f req/s (1-min window)\n", len(reqs), o.day, rep.PeakRate)

	fleet := func(s cluster.Scaler, initial int) (cluster.AutoscaleResult, error) {
		gpus := make([]cluster.GPU, o.slots)
		for i := range gpus {
			gpus[i] = cluster.H100
		}
		cfg := cluster.Config{GPUs: gpus, Policy: cluster.PolicyOasis, Seed: 1, Autoscale: &cluster.AutoscaleConfig{
			Scaler: s, Initial: initial, Min: 1, ColdStart: o.coldStart, SLO: slo}}
		_, res, err := cluster.RunAutoscaled(cfg, reqs)
		return res, err
	}
	sc := cluster.ShippedScaler(o.sloTTFT, o.target)
	sc.TTFTFactor, sc.TTFTP90, sc.Trigger, sc.OutPercent = o.ttftFactor, o.p90, o.trigger, o.outPercent
	if o.shippedOnly {
		shipped, err := fleet(sc, 1)
		if err != nil {
			return err
		}
		fmt.Printf("shipped: %.2f GPU-hours, attainment %.4f, TTFT p90 %.2f s, engines %d–%d, %d / %d\n", shipped.GPUHours,
			shipped.Attain, shipped.TTFTP90, shipped.MinEngine, shipped.MaxEngine, shipped.ScaleOuts, shipped.ScaleIns)
		return nil
	}
	if o.plannerOnly && o.static > 0 {
		p, err := fleet(&cluster.PlannerScaler{Capacity: rep.PeakRate / float64(o.static), AdjustInterval: o.adjust, Headroom: o.headroom}, 1)
		if err != nil {
			return err
		}
		fmt.Printf("planner: %.2f GPU-hours, attainment %.4f, TTFT p90 %.2f s, engines %d–%d, %d / %d\n", p.GPUHours,
			p.Attain, p.TTFTP90, p.MinEngine, p.MaxEngine, p.ScaleOuts, p.ScaleIns)
		return nil
	}
	staticRun := func(n int) (cluster.AutoscaleResult, error) { return fleet(cluster.StaticScaler{N: n}, n) }
	var static cluster.AutoscaleResult
	if o.static > 0 {
		static, err = staticRun(o.static)
	} else {
		static, err = sizeStatic(o, rep.StaticSizing, staticRun)
	}
	if err != nil {
		return err
	}
	static.Scaler = fmt.Sprintf("static, sized for the peak (%d engines)", static.MaxEngine)
	shipped, err := fleet(sc, 1)
	if err != nil {
		return err
	}
	shipped.Scaler = "shipped policy (threshold: median TTFT estimate, in-flight; idle 5 min)"
	if o.p90 {
		shipped.Scaler = "shipped policy on the p90 TTFT estimate"
	}
	capacity := rep.PeakRate / float64(static.MaxEngine)
	planner, err := fleet(&cluster.PlannerScaler{Capacity: capacity, AdjustInterval: o.adjust, Headroom: o.headroom}, 1)
	if err != nil {
		return err
	}
	planner.Scaler = fmt.Sprintf("Dynamo-Planner-like (rate × %.2f / %.2f req/s per engine, every %s)", max(o.headroom, 1), capacity, o.adjust)
	rep.Fleets = []cluster.AutoscaleResult{static, shipped, planner}
	writeTable(os.Stdout, rep)
	return writeJSON(filepath.Join(o.outDir, "autoscale.json"), rep)
}

// sizeStatic finds the smallest static fleet whose attainment reaches o.attain × that of o.slots
// engines (bisection; attainment grows with engines) and returns its run.
func sizeStatic(o options, seen map[int]float64, run func(int) (cluster.AutoscaleResult, error)) (cluster.AutoscaleResult, error) {
	try := func(n int) (cluster.AutoscaleResult, error) {
		r, err := run(n)
		if err == nil {
			seen[n] = r.Attain
			fmt.Fprintf(os.Stderr, "static %d engines: attainment %.4f, TTFT p90 %.2f s\n", n, r.Attain, r.TTFTP90)
		}
		return r, err
	}
	best, err := try(o.slots)
	if err != nil {
		return best, err
	}
	goal := o.attain * best.Attain
	lo, hi := 0, o.slots // lo misses the goal (0 engines serve nothing), hi meets it
	for lo+1 < hi {
		n := (lo + hi) / 2
		r, err := try(n)
		if err != nil {
			return r, err
		}
		if r.Attain >= goal {
			hi, best = n, r
		} else {
			lo = n
		}
	}
	return best, nil
}

// peakRate is the most arrivals per second in any window (sliding over arrivals).
func peakRate(reqs []*cluster.Request, window time.Duration) float64 {
	best, j := 0, 0
	w := window.Milliseconds()
	for i := range reqs {
		for reqs[i].Arrival-reqs[j].Arrival >= w {
			j++
		}
		best = max(best, i-j+1)
	}
	return float64(best) / window.Seconds()
}

func writeTable(w io.Writer, rep report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	static := rep.Fleets[0]
	fmt.Fprintln(tw, "fleet\tGPU-hours\tvs static\tSLO attainment\tvs static\tTTFT p90\tTPOT p90\tengines min–max\tscale-outs / -ins")
	for _, f := range rep.Fleets {
		fmt.Fprintf(tw, "%s\t%.2f\t%+.1f%%\t%.4f\t%.1f%%\t%.2f s\t%.0f ms\t%d–%d\t%d / %d\n", f.Scaler, f.GPUHours,
			100*(f.GPUHours/static.GPUHours-1), f.Attain, 100*f.Attain/static.Attain, f.TTFTP90, 1000*f.TPOTP90,
			f.MinEngine, f.MaxEngine, f.ScaleOuts, f.ScaleIns)
	}
	tw.Flush()
}

func writeJSON(path string, v any) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
