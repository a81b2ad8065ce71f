package cluster

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// AttainmentGoal is DistServe's: a rate is sustained when at least 90% of
// requests meet both SLOs.
const AttainmentGoal = 0.9

// PDSummary condenses one split's sweep, per SLO.
type PDSummary struct {
	Split string       `json:"split"`
	SLO   []SLOSummary `json:"slo"`
}

// SLOSummary is one split under one SLO: MaxRate is the highest swept rate
// with attainment ≥ 90% (0: none) and Goodput the requests per second meeting
// the SLO there (DistServe's goodput); BestGoodput the most at any swept rate.
type SLOSummary struct {
	TTFT         float64 `json:"ttft_slo_s"`
	TPOT         float64 `json:"tpot_slo_s"`
	MaxRate      float64 `json:"max_rate_at_slo_rps"`
	MaxRateScale float64 `json:"max_rate_scale"`
	Goodput      float64 `json:"goodput_at_slo_rps"`
	BestGoodput  float64 `json:"best_goodput_rps"`
}

// PDReport is the JSON document bench-disagg writes.
type PDReport struct {
	Trace     string      `json:"trace"`
	Requests  int         `json:"requests"`
	Workers   int         `json:"workers"`
	GPU       string      `json:"gpu"`
	Model     string      `json:"model"`
	BytesPerT int64       `json:"kv_bytes_per_token"`
	LinkGBps  float64     `json:"link_gbps"`
	Summaries []PDSummary `json:"splits"`
	Runs      []PDResult  `json:"runs"`
}

// SummarisePD builds one summary per split, in the runs' order of first
// appearance; every run must be judged against the same SLOs.
func SummarisePD(runs []PDResult) []PDSummary {
	var out []PDSummary
	idx := map[string]int{}
	for _, r := range runs {
		i, ok := idx[r.Split]
		if !ok {
			i = len(out)
			idx[r.Split] = i
			out = append(out, PDSummary{Split: r.Split, SLO: make([]SLOSummary, len(r.SLO))})
		}
		for k, o := range r.SLO {
			s := &out[i].SLO[k]
			s.TTFT, s.TPOT = o.TTFT, o.TPOT
			s.BestGoodput = max(s.BestGoodput, o.Goodput)
			if o.Attainment >= AttainmentGoal && r.Rate > s.MaxRate {
				s.MaxRate, s.Goodput, s.MaxRateScale = r.Rate, o.Goodput, r.RateScale
			}
		}
	}
	return out
}

func sloName(ttft, tpot float64) string {
	return fmt.Sprintf("%gs/%gms", ttft, tpot*1e3)
}

// WritePDTable prints every run, then the summaries.
func WritePDTable(w io.Writer, rep *PDReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "split\tscale\trate r/s\tTTFT p50 s\tp90 s\tTPOT p50 ms\tp90 ms\tp99 ms\t")
	if len(rep.Runs) > 0 {
		for _, o := range rep.Runs[0].SLO {
			fmt.Fprintf(tw, "met %s\tgoodput r/s\t", sloName(o.TTFT, o.TPOT))
		}
	}
	fmt.Fprintf(tw, "done r/s\thit\txfer p90 ms\tD recompute\tpreempt\twall s\t\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\t", r.Split, r.RateScale, r.Rate, r.TTFTP50, r.TTFTP90,
			r.TPOTP50*1e3, r.TPOTP90*1e3, r.TPOTP99*1e3)
		for _, o := range r.SLO {
			fmt.Fprintf(tw, "%.3f\t%.2f\t", o.Attainment, o.Goodput)
		}
		fmt.Fprintf(tw, "%.2f\t%.3f\t%.1f\t%d\t%d\t%.1f\t\n", r.Throughput, r.HitRatio, r.XferP90*1e3, r.DecodeRecompute, r.Preemptions, r.WallSeconds)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nSLO attainment: share of requests with TTFT and TPOT both within the SLO; a rate is sustained at >= %.0f%%\n\n", AttainmentGoal*100)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "split\tSLO TTFT/TPOT\tmax rate at SLO r/s\tgoodput there r/s\tbest goodput r/s\t\n")
	for _, s := range rep.Summaries {
		for _, o := range s.SLO {
			fmt.Fprintf(tw, "%s\t%s\t%.2f\t%.2f\t%.2f\t\n", s.Split, sloName(o.TTFT, o.TPOT), o.MaxRate, o.Goodput, o.BestGoodput)
		}
	}
	tw.Flush()
}
