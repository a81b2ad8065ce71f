// Command bench-autoscale is `make bench-autoscale`: the cluster simulator on one day of a trace
// (its requests re-timed to a day-shaped rate, cluster.Diurnal) with three fleets of H100
// engines: static and sized for the peak, the recipes' shipped autoscaling policy (the Oasis
// strategy plugin's rule, autoscaler/sizing, as cluster.RuleScaler) and a Dynamo-Planner-like one
// (cluster.PlannerScaler). It prints
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

	"github.com/oasis-llm/oasis/autoscaler/sizing"
	"github.com/oasis-llm/oasis/bench/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-autoscale:", err)
		os.Exit(1)
	}
}

type options struct {
	trace            string
	limit, slots     int
	day, coldStart   time.Duration
	amp, attain      float64
	sloTTFT, sloTPOT float64
	outDir           string
	adjust           time.Duration
	static           int
	repeat           int
	shippedOnly      bool
	plannerOnly      bool
	headroom         float64
	// the shipped rule (the strategy plugin's check config and the policy's timings)
	ruleHeadroom, ruleAttain, capacity float64
	learned                            bool
	eval, window, coolOut, coolIn      time.Duration
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
	flag.Float64Var(&o.sloTTFT, "slo-ttft", 2, "SLO: a request's TTFT, s")
	flag.Float64Var(&o.sloTPOT, "slo-tpot", 0.1, "SLO: a request's TPOT, s")
	flag.Float64Var(&o.attain, "static-attainment", 0.995, "the static fleet is the smallest whose attainment reaches this share of the attainment of -slots engines (some requests miss the SLO on any fleet: prompts too long for the TTFT SLO)")
	flag.DurationVar(&o.adjust, "planner-interval", time.Minute, "planner: adjustment interval")
	flag.IntVar(&o.static, "static-engines", 0, "the static fleet's size (0: the smallest meeting -static-attainment, found by bisection)")
	flag.Float64Var(&o.ruleHeadroom, "headroom", 0.08, "shipped policy: the rule's headroom (the check's headroom)")
	flag.Float64Var(&o.ruleAttain, "attainment", sizing.DefaultAttainment, "shipped policy: the attainment a learned capacity aims for (the check's attainment)")
	flag.Float64Var(&o.capacity, "capacity", 0, "shipped policy: requests/s one engine serves within the SLO (the check's capacity; 0: the static fleet's, peak rate ÷ its engines, as the planner profiles it)")
	flag.BoolVar(&o.learned, "learned", false, "shipped policy: capacity = \"learned\" (from the router's learned prefill rate) instead of a profiled number")
	flag.DurationVar(&o.eval, "eval-interval", 10*time.Second, "shipped policy: evaluation_interval")
	flag.DurationVar(&o.window, "window", time.Minute, "shipped policy: the arrival rate's window (the check's rate(...[window]))")
	flag.DurationVar(&o.coolOut, "cooldown-out", 30*time.Second, "shipped policy: cooldown_on_scale_up")
	flag.DurationVar(&o.coolIn, "cooldown-in", time.Minute, "shipped policy: cooldown")
	flag.BoolVar(&o.shippedOnly, "shipped-only", false, "run only the shipped policy (tuning; its profiled capacity from -capacity or -static-engines)")
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
	shippedRule := func(static int) *cluster.RuleScaler {
		c := o.capacity
		if c == 0 && static > 0 {
			c = rep.PeakRate / float64(static)
		}
		if o.learned {
			c = 0
		}
		return &cluster.RuleScaler{Rule: sizing.Rule{SLO: o.sloTTFT, Headroom: o.ruleHeadroom, Attainment: o.ruleAttain, Min: 1},
			Capacity: c, EvalInterval: o.eval, Window: o.window, CooldownOut: o.coolOut, CooldownIn: o.coolIn}
	}
	if err := shippedRule(0).Rule.Validate(); err != nil {
		return err
	}
	if o.shippedOnly {
		if o.capacity == 0 && o.static == 0 && !o.learned {
			return fmt.Errorf("-shipped-only needs -capacity, -static-engines or -learned")
		}
		shipped, err := fleet(shippedRule(o.static), 1)
		if err != nil {
			return err
		}
		fmt.Printf("shipped: %.2f GPU-hours, attainment %.4f, TTFT p90 %.2f s, engines %d–%d, %d / %d\n", shipped.GPUHours,
			shipped.Attain, shipped.TTFTP90, shipped.MinEngine, shipped.MaxEngine, shipped.ScaleOuts, shipped.ScaleIns)
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
	sr := shippedRule(static.MaxEngine)
	shipped, err := fleet(sr, 1)
	if err != nil {
		return err
	}
	shipped.Scaler = fmt.Sprintf("shipped policy (oasis-sizing: rate × %.2f ÷ %.2f req/s per engine, every %s)", 1+o.ruleHeadroom, sr.Capacity, o.eval)
	if o.learned {
		shipped.Scaler = fmt.Sprintf("shipped policy (oasis-sizing: rate × %.2f ÷ learned capacity, attainment %.3f, every %s)", 1+o.ruleHeadroom, o.ruleAttain, o.eval)
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
