// Command bench-federation replays a request trace (Mooncake JSONL format)
// through the cluster simulator with several datacenters, each with its own
// workers and Oasis router, and compares the federation policies (local,
// best-prefix, oasis) over a sweep of request rates: TTFT, throughput at SLO
// (refined by bisection) and WAN egress. Writes a table (stdout) and
// federation.json.
//
//	go run ./bench/cluster/cmd/bench-federation -dcs 2 -workers 4 -rtt 30ms -skew 0.8
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"time"

	"github.com/oasis-llm/oasis/bench/cluster"
	"github.com/oasis-llm/oasis/router/policy"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-federation:", err)
		os.Exit(1)
	}
}

// report is federation.json.
type report struct {
	Trace    string                    `json:"trace"`
	Requests int                       `json:"requests"`
	DCs      int                       `json:"dcs"`
	Workers  int                       `json:"workers_per_dc"`
	RTT      string                    `json:"rtt"`
	Skew     float64                   `json:"skew"`
	Shift    string                    `json:"shift_period,omitempty"`
	Settings policy.FederationSettings `json:"settings"`
	MaxInFlt int                       `json:"max_in_flight_per_dc"`
	RefScale float64                   `json:"reference_rate_scale"`
	LowScale float64                   `json:"low_rate_scale"`
	Policies []summary                 `json:"policies"`
	Runs     []cluster.FedResult       `json:"runs"`
}

// summary is one policy's figures.
type summary struct {
	Federation string            `json:"federation"`
	Ref        cluster.FedResult `json:"at_reference"`
	Low        cluster.FedResult `json:"at_low"`
	// AtSLO is the run at the highest rate scale meeting the SLO (zero
	// when none does).
	AtSLO cluster.FedResult `json:"at_slo"`
}

func run() error {
	var (
		trace    = flag.String("trace", "bench/cluster/traces/mooncake-conversation.jsonl.gz", "trace file in the Mooncake JSONL format")
		limit    = flag.Int("limit", 0, "use only the first N requests (0: all)")
		dcs      = flag.Int("dcs", 2, "datacenters")
		workers  = flag.Int("workers", 4, "workers per datacenter (H100/A100/H100/L40S repeating)")
		rtt      = flag.Duration("rtt", 30*time.Millisecond, "round trip between datacenters")
		skew     = flag.Float64("skew", 0.8, "share of arrivals at dc1 (the rest split evenly)")
		shift    = flag.Duration("shift", 0, "diurnal shift: dc1's share swings from -skew to 1-skew and back over this much trace time (0: fixed)")
		scales   = flag.String("scales", "0.25,0.5,1,1.5,2,3", "rate scales to sweep (arrival time / scale)")
		bisect   = flag.Int("bisect", 3, "bisection steps refining each policy's highest rate scale meeting the SLO")
		policies = flag.String("policies", strings.Join(cluster.FedPolicies, ","), "federation policies to compare")
		perWk    = flag.Int("max-inflight-per-worker", 4, "each datacenter's admission cap (max_in_flight) per worker; 0: uncapped")
		maxSpill = flag.Float64("max-spill", 0, "federation max_spill_fraction (0: the policy default)")
		resume   = flag.Float64("resume-spill", 0, "federation resume_spill_fraction (0: the policy default, or max-spill - 0.1)")
		budget   = flag.Duration("queue-wait-budget", 0, "federation queue_wait_budget (0: the policy default)")
		cpuGiB   = flag.Float64("cpu-gib", 0, "host memory per worker for a CPU KV tier, GiB")
		diskGiB  = flag.Float64("disk-gib", 0, "SSD per worker for a disk KV tier, GiB")
		outDir   = flag.String("out", "bench/out", "directory for federation.json")
		parallel = flag.Int("parallel", runtime.NumCPU(), "simulations run at once")
	)
	flag.Parse()
	reqs, err := cluster.LoadTrace(*trace)
	if err != nil {
		return err
	}
	if *limit > 0 && *limit < len(reqs) {
		reqs = reqs[:*limit]
	}
	if err := cluster.Keys(reqs, "mooncake", 16); err != nil {
		return err
	}
	set := settings(*maxSpill, *resume, *budget)
	gpus := cluster.Heterogeneous(*workers)
	for i := range gpus {
		gpus[i].CPUBlocks = cluster.BlocksForGiB(*cpuGiB, 16)
		gpus[i].DiskBlocks = cluster.BlocksForGiB(*diskGiB, 16)
	}
	base := cluster.FedConfig{Config: cluster.Config{GPUs: gpus, Policy: cluster.PolicyOasis, Seed: 1},
		DCs: *dcs, RTT: *rtt, Skew: *skew, ShiftPeriod: *shift, Settings: set, MaxInFlight: *perWk * *workers}
	rates, err := cluster.ParseScales(*scales)
	if err != nil {
		return err
	}
	pols := strings.Split(*policies, ",")
	fmt.Fprintf(os.Stderr, "%d requests, %.0f s at scale 1\n", len(reqs), cluster.Span(reqs))

	var cfgs []cluster.FedConfig
	for _, r := range rates {
		for _, p := range pols {
			c := base
			c.Federation, c.RateScale = strings.TrimSpace(p), r
			cfgs = append(cfgs, c)
		}
	}
	runs, err := runAll(cfgs, reqs, *parallel)
	if err != nil {
		return err
	}
	more, err := refine(base, pols, rates, runs, reqs, *bisect, *parallel)
	if err != nil {
		return err
	}
	runs = append(runs, more...)
	rep := &report{Trace: *trace, Requests: len(reqs), DCs: *dcs, Workers: *workers, RTT: rtt.String(), Skew: *skew,
		Settings: set, MaxInFlt: base.MaxInFlight, LowScale: rates[0], Runs: runs}
	if *shift > 0 {
		rep.Shift = shift.String()
	}
	rep.RefScale = referenceScale(runs, rates)
	for _, p := range pols {
		rep.Policies = append(rep.Policies, summarise(strings.TrimSpace(p), runs, rep.RefScale, rates[0]))
	}
	writeTable(rep)
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*outDir, "federation.json"), append(js, '\n'), 0o644)
}

// settings is the federation section: the policy defaults with the flags'
// overrides (0: default; a spill cap alone resumes 0.1 below it).
func settings(maxSpill, resume float64, budget time.Duration) policy.FederationSettings {
	set := policy.DefaultFederation()
	if maxSpill > 0 {
		set.MaxSpillFraction, set.ResumeSpillFraction = maxSpill, max(maxSpill-0.1, 0)
	}
	if resume > 0 {
		set.ResumeSpillFraction = resume
	}
	if budget > 0 {
		set.QueueWaitBudget = budget
	}
	return set
}

// parseScales parses -scales, ascending.
func runAll(cfgs []cluster.FedConfig, reqs []*cluster.Request, parallel int) ([]cluster.FedResult, error) {
	return cluster.RunParallel(cfgs, parallel, func(c cluster.FedConfig) (cluster.FedResult, error) { return cluster.RunFederated(c, reqs) },
		func(r cluster.FedResult) {
			fmt.Fprintf(os.Stderr, "  %-11s scale %6.3f: TTFT p90 %8.3fs done %6.2f r/s forwarded %5.1f%% served %v (%.1fs)\n",
				r.Federation, r.RateScale, r.TTFTP90, r.Throughput, r.ForwardedPct, r.Served, r.WallSeconds)
		})
}

// refine bisects, for every policy at once, between the highest swept rate
// scale meeting the SLO and the next one above it, steps times.
func refine(base cluster.FedConfig, pols []string, rates []float64, runs []cluster.FedResult, reqs []*cluster.Request,
	steps, parallel int) ([]cluster.FedResult, error) {
	type bracket struct{ lo, hi float64 }
	br := map[string]*bracket{}
	for _, p := range pols {
		p = strings.TrimSpace(p)
		b := &bracket{}
		for _, r := range rates {
			if res, ok := find(runs, p, r); ok && res.MeetsSLO() && b.hi == 0 {
				b.lo = r
			} else if ok && !res.MeetsSLO() && b.lo > 0 && b.hi == 0 {
				b.hi = r
			}
		}
		if b.lo > 0 && b.hi > 0 {
			br[p] = b
		}
	}
	var out []cluster.FedResult
	for range steps {
		var cfgs []cluster.FedConfig
		for p, b := range br {
			c := base
			c.Federation, c.RateScale = p, (b.lo+b.hi)/2
			cfgs = append(cfgs, c)
		}
		if len(cfgs) == 0 {
			break
		}
		res, err := runAll(cfgs, reqs, parallel)
		if err != nil {
			return nil, err
		}
		for _, r := range res {
			if b := br[r.Federation]; r.MeetsSLO() {
				b.lo = r.RateScale
			} else {
				b.hi = r.RateScale
			}
		}
		out = append(out, res...)
	}
	return out, nil
}

func find(runs []cluster.FedResult, pol string, scale float64) (cluster.FedResult, bool) {
	for _, r := range runs {
		if r.Federation == pol && r.RateScale == scale {
			return r, true
		}
	}
	return cluster.FedResult{}, false
}

// referenceScale is the lowest swept scale at which local-only misses the
// SLO (its busiest datacenter saturates), else the highest swept.
func referenceScale(runs []cluster.FedResult, rates []float64) float64 {
	for _, r := range rates {
		if res, ok := find(runs, cluster.FedLocal, r); ok && !res.MeetsSLO() {
			return r
		}
	}
	return rates[len(rates)-1]
}

func summarise(pol string, runs []cluster.FedResult, ref, low float64) summary {
	s := summary{Federation: pol}
	s.Ref, _ = find(runs, pol, ref)
	s.Low, _ = find(runs, pol, low)
	for _, r := range runs {
		if r.Federation == pol && r.MeetsSLO() && r.RateScale > s.AtSLO.RateScale {
			s.AtSLO = r
		}
	}
	return s
}

func writeTable(rep *report) {
	fmt.Printf("%d requests, %d datacenters × %d workers, RTT %s, skew %.2f, admission cap %d per datacenter\n",
		rep.Requests, rep.DCs, rep.Workers, rep.RTT, rep.Skew, rep.MaxInFlt)
	fmt.Printf("%-12s | at scale %g: TTFT p50 / p90 / p99, forwarded, prompt egress | at scale %g: TTFT p90, forwarded | throughput at SLO\n",
		"policy", rep.RefScale, rep.LowScale)
	for _, s := range rep.Policies {
		slo := "never meets"
		if s.AtSLO.RateScale > 0 {
			slo = fmt.Sprintf("%.2f req/s (scale %.3f)", s.AtSLO.Throughput, s.AtSLO.RateScale)
		}
		fmt.Printf("%-12s | %.2f / %.2f / %.2f s, %.1f%%, %.1f MB | %.3f s, %.1f%% | %s\n", s.Federation,
			s.Ref.TTFTP50, s.Ref.TTFTP90, s.Ref.TTFTP99, s.Ref.ForwardedPct, float64(s.Ref.EgressBytes)/1e6,
			s.Low.TTFTP90, s.Low.ForwardedPct, slo)
	}
}
