package cluster

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// AttainmentGoal is DistServe's: a rate is sustained when at least 90% of
// requests meet both SLOs.
const AttainmentGoal = 0.9

// PDSummary condenses one split's sweep.
type PDSummary struct {
	Split string `json:"split"`
	// MaxRate is the highest swept rate with SLO attainment ≥ 90% (0: none),
	// and Goodput the requests per second meeting both SLOs there.
	MaxRate      float64 `json:"max_rate_at_slo_rps"`
	Goodput      float64 `json:"goodput_at_slo_rps"`
	BestGoodput  float64 `json:"best_goodput_rps"` // the most requests/s meeting both SLOs at any swept rate
	MaxRateScale float64 `json:"max_rate_scale"`
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
	TTFTSLO   float64     `json:"ttft_slo_s"`
	TPOTSLO   float64     `json:"tpot_slo_s"`
	Summaries []PDSummary `json:"splits"`
	Runs      []PDResult  `json:"runs"`
}

// SummarisePD builds one summary per split, in the runs' order of first
// appearance.
func SummarisePD(runs []PDResult) []PDSummary {
	var out []PDSummary
	idx := map[string]int{}
	for _, r := range runs {
		i, ok := idx[r.Split]
		if !ok {
			i = len(out)
			idx[r.Split] = i
			out = append(out, PDSummary{Split: r.Split})
		}
		s := &out[i]
		s.BestGoodput = max(s.BestGoodput, r.Goodput)
		if r.Attainment >= AttainmentGoal && r.Rate > s.MaxRate {
			s.MaxRate, s.Goodput, s.MaxRateScale = r.Rate, r.Goodput, r.RateScale
		}
	}
	return out
}

// WritePDTable prints every run, then the summaries.
func WritePDTable(w io.Writer, rep *PDReport) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "split\tscale\trate r/s\tTTFT p50 s\tp90 s\tTPOT p50 ms\tp90 ms\tp99 ms\tSLO met\tgoodput r/s\tdone r/s\thit\txfer p90 ms\tD recompute\tpreempt\twall s\t\n")
	for _, r := range rep.Runs {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.3f\t%.3f\t%.1f\t%.1f\t%.1f\t%.3f\t%.2f\t%.2f\t%.3f\t%.1f\t%d\t%d\t%.1f\t\n",
			r.Split, r.RateScale, r.Rate, r.TTFTP50, r.TTFTP90, r.TPOTP50*1e3, r.TPOTP90*1e3, r.TPOTP99*1e3, r.Attainment, r.Goodput,
			r.Throughput, r.HitRatio, r.XferP90*1e3, r.DecodeRecompute, r.Preemptions, r.WallSeconds)
	}
	tw.Flush()
	fmt.Fprintf(w, "\nSLOs: TTFT <= %.2f s and TPOT <= %.0f ms; a rate is sustained when >= %.0f%% of requests meet both\n\n",
		rep.TTFTSLO, rep.TPOTSLO*1e3, AttainmentGoal*100)
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "split\tmax rate at SLO r/s\tgoodput there r/s\tbest goodput r/s\t\n")
	for _, s := range rep.Summaries {
		fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t%.2f\t\n", s.Split, s.MaxRate, s.Goodput, s.BestGoodput)
	}
	tw.Flush()
}
