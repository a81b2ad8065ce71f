package cluster

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
)

// Summary condenses a sweep for one policy.
type Summary struct {
	Policy   string `json:"policy"`
	Learning string `json:"learning,omitempty"`
	// At the reference rate (the highest swept rate at which round_robin
	// still meets the SLO, or the lowest rate if it never does):
	HitRatio       float64 `json:"hit_ratio"`
	OracleHitRatio float64 `json:"oracle_hit_ratio"`
	TTFTP50        float64 `json:"ttft_p50_s"`
	TTFTP90        float64 `json:"ttft_p90_s"`
	TTFTP99        float64 `json:"ttft_p99_s"`
	Imbalance      float64 `json:"imbalance"`
	JoulesPerToken float64 `json:"joules_per_token"`
	// ThroughputAtSLO is the highest completed requests/s over the swept
	// rates at which TTFT p90 ≤ 2 s (0 if none).
	ThroughputAtSLO    float64 `json:"throughput_at_slo_rps"`
	OutputTokPSAtSLO   float64 `json:"output_tokens_per_s_at_slo"`
	RateScaleAtSLO     float64 `json:"rate_scale_at_slo"`
	ReferenceRateScale float64 `json:"reference_rate_scale"`
}

// Report is the JSON document bench-routing writes.
type Report struct {
	Trace          string    `json:"trace"`
	Requests       int       `json:"requests"`
	Workers        int       `json:"workers"`
	Cluster        string    `json:"cluster"`
	BlockSize      int       `json:"block_size"`
	OracleHitRatio float64   `json:"oracle_hit_ratio"`
	ReferenceScale float64   `json:"reference_rate_scale"`
	Summaries      []Summary `json:"policies"`
	Extra          []Result  `json:"learning_variants,omitempty"`
	Runs           []Result  `json:"runs"`
	Targets        []Target  `json:"targets"`
	// The peer comparison: every policy's highest rate meeting SLO (found
	// by bisection), runs of Oasis at the best peer's rate and of the
	// approximate-learning modes at the reference rate, and the targets
	// against the best peer.
	SLO RoutingSLO `json:"slo"`
	// Ceiling bounds every policy's throughput at the SLO's TPOT.
	Ceiling      Ceiling     `json:"ceiling"`
	Bisections   []Bisection `json:"bisection,omitempty"`
	PeerVariants []Result    `json:"peer_variants,omitempty"`
	PeerTargets  []Target    `json:"peer_targets,omitempty"`
}

// Target is one issue target with its measured value.
type Target struct {
	Name     string  `json:"name"`
	Goal     string  `json:"goal"`
	Measured float64 `json:"measured"`
	Met      bool    `json:"met"`
}

// ReferenceScale is the highest rate scale at which round_robin meets the SLO.
func ReferenceScale(runs []Result) float64 {
	best := -1.0
	lowest := -1.0
	for _, r := range runs {
		if r.Policy != PolicyRoundRobin {
			continue
		}
		if lowest < 0 || r.RateScale < lowest {
			lowest = r.RateScale
		}
		if r.MeetsSLO() && r.RateScale > best {
			best = r.RateScale
		}
	}
	if best < 0 {
		return lowest
	}
	return best
}

// Summarise builds per-policy summaries from a sweep.
func Summarise(runs []Result, oracle float64) []Summary {
	ref := ReferenceScale(runs)
	by := map[string]*Summary{}
	var order []string
	for _, r := range runs {
		key := r.Policy
		s, ok := by[key]
		if !ok {
			s = &Summary{Policy: r.Policy, Learning: r.Learning, OracleHitRatio: oracle, ReferenceRateScale: ref}
			by[key] = s
			order = append(order, key)
		}
		if r.RateScale == ref {
			s.HitRatio, s.TTFTP50, s.TTFTP90, s.TTFTP99 = r.HitRatio, r.TTFTP50, r.TTFTP90, r.TTFTP99
			s.Imbalance, s.JoulesPerToken = r.Imbalance, r.JoulesPerToken
		}
		if r.MeetsSLO() && r.Throughput > s.ThroughputAtSLO {
			s.ThroughputAtSLO, s.OutputTokPSAtSLO, s.RateScaleAtSLO = r.Throughput, r.OutputTokPS, r.RateScale
		}
	}
	out := make([]Summary, 0, len(order))
	for _, k := range order {
		out = append(out, *by[k])
	}
	return out
}

// Targets evaluates the trace targets for the oasis policy against
// round_robin.
func Targets(sums []Summary, runs []Result) []Target {
	var rr, oa *Summary
	for i := range sums {
		switch sums[i].Policy {
		case PolicyRoundRobin:
			rr = &sums[i]
		case PolicyOasis:
			oa = &sums[i]
		}
	}
	if rr == nil || oa == nil {
		return nil
	}
	ratio := func(a, b float64) float64 {
		if b == 0 {
			return 0
		}
		return a / b
	}
	var wall float64
	for _, r := range runs {
		wall = max(wall, r.WallSeconds)
	}
	t := []Target{
		{Name: "hit ratio / oracle", Goal: ">= 0.90", Measured: ratio(oa.HitRatio, oa.OracleHitRatio)},
		{Name: "TTFT p90 oasis / round_robin at reference rate", Goal: "<= 0.5", Measured: ratio(oa.TTFTP90, rr.TTFTP90)},
		{Name: "throughput at SLO oasis / round_robin", Goal: ">= 2", Measured: ratio(oa.ThroughputAtSLO, rr.ThroughputAtSLO)},
		{Name: "tokens per joule oasis / round_robin at reference rate", Goal: ">= 1.4", Measured: ratio(rr.JoulesPerToken, oa.JoulesPerToken)},
		{Name: "slowest run wall seconds (parallel runs share the CPU)", Goal: "<= 30", Measured: wall},
	}
	t[0].Met = t[0].Measured >= 0.9
	t[1].Met = t[1].Measured > 0 && t[1].Measured <= 0.5
	t[2].Met = t[2].Measured >= 2
	t[3].Met = t[3].Measured >= 1.4
	t[4].Met = t[4].Measured <= 30
	return t
}

// WriteTable prints the sweep and the summary.
func WriteTable(w io.Writer, rep *Report) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\tlearning\tscale\trate r/s\thit\tTTFT p50\tp90\tp99\tdone r/s\tout tok/s\timbal\tJ/tok\tresyncs\treplays\twall s\t\n")
	runs := append([]Result(nil), rep.Runs...)
	runs = append(runs, rep.Extra...)
	sort.SliceStable(runs, func(i, j int) bool { return runs[i].RateScale < runs[j].RateScale })
	for _, r := range runs {
		learning := r.Learning
		if r.EventLoss > 0 || r.EventDelay > 0 {
			learning += fmt.Sprintf(" d%.0fms l%.0f%%", r.EventDelay*1000, r.EventLoss*100)
			if !r.Replay {
				learning += " norep"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%.0f\t%.2f\t%.3f\t%d\t%d\t%.1f\t\n",
			r.Policy, learning, r.RateScale, r.Rate, r.HitRatio, r.TTFTP50, r.TTFTP90, r.TTFTP99, r.Throughput, r.OutputTokPS, r.Imbalance, r.JoulesPerToken, r.Resyncs, r.Replays, r.WallSeconds)
	}
	tw.Flush()
	fmt.Fprintf(w, "\noracle hit ratio %.3f; reference rate scale %.2f (highest where round_robin TTFT p90 <= 2 s)\n\n", rep.OracleHitRatio, rep.ReferenceScale)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "policy\thit\thit/oracle\tTTFT p50\tp90\tp99\tthroughput@SLO r/s\timbalance\tJ/tok\t\n")
	for _, s := range rep.Summaries {
		fmt.Fprintf(tw, "%s\t%.3f\t%.2f\t%.3f\t%.3f\t%.3f\t%.2f\t%.2f\t%.3f\t\n", s.Policy, s.HitRatio, s.HitRatio/s.OracleHitRatio, s.TTFTP50, s.TTFTP90, s.TTFTP99, s.ThroughputAtSLO, s.Imbalance, s.JoulesPerToken)
	}
	tw.Flush()
	if len(rep.Targets) > 0 {
		fmt.Fprintln(w)
		for _, t := range rep.Targets {
			met := "NOT MET"
			if t.Met {
				met = "met"
			}
			fmt.Fprintf(w, "target %-55s goal %-7s measured %.3f  %s\n", t.Name, t.Goal, t.Measured, met)
		}
	}
}
