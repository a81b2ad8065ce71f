// Command bench-disagg replays a request trace (Mooncake JSONL format)
// through the cluster simulator on one GPU count, aggregated and split into
// prefill and decode pools (xPyD), over a sweep of request rates, and writes
// a table (stdout), disagg.json and plots of TPOT p90 and TTFT p90 versus rate
// (disagg-tpot.png, disagg-ttft.png).
//
//	go run ./bench/cluster/cmd/bench-disagg -trace bench/cluster/traces/mooncake-conversation.jsonl.gz -gpus 8 -splits 0,2,4,6
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/oasis-llm/oasis/bench/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-disagg:", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		trace    = flag.String("trace", "bench/cluster/traces/mooncake-conversation.jsonl.gz", "trace file in the Mooncake JSONL format")
		gpus     = flag.Int("gpus", 8, "GPUs in the cluster (all H100, oasis-sim's Llama-3-8B model)")
		splits   = flag.String("splits", "0,2,4,6", "prefill GPUs of each configuration (0: aggregated); the rest decode")
		scales   = flag.String("scales", "1,2,3,4,5,6", "rate scales to sweep (arrival time / scale)")
		link     = flag.Float64("link-gbps", cluster.DefaultLinkGBps, "KV transfer bandwidth of each GPU's NIC, GB/s (default: 400 Gb/s ConnectX-7 at ~80%, NIXL over RDMA)")
		sloList  = flag.String("slos", "2s/100ms,2s/25ms", "SLOs judged, each TTFT/TPOT (the first is plotted)")
		chunk    = flag.Int("max-batched-tokens", 0, "every engine's token budget per step, the chunked-prefill chunk (0: 8192, vLLM's default)")
		limit    = flag.Int("limit", 0, "use only the first N requests (0: all)")
		outDir   = flag.String("out", "bench/out", "directory for disagg.json and the plots")
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
	if len(reqs) < 2 {
		return fmt.Errorf("need at least 2 requests")
	}
	rates, err := cluster.ParseScales(*scales)
	if err != nil {
		return err
	}
	slos, err := parseSLOs(*sloList)
	if err != nil {
		return err
	}
	base := cluster.PDConfig{GPU: cluster.H100, Workers: *gpus, LinkGBps: *link, KV: cluster.Llama3_8B(), SLOs: slos, MaxBatchedTokens: *chunk}
	cfgs, err := configs(base, *splits, rates)
	if err != nil {
		return err
	}
	t0 := time.Now()
	fmt.Fprintf(os.Stderr, "%d requests, %.0f s at scale 1, %d runs\n", len(reqs), cluster.Span(reqs), len(cfgs))
	runs, err := cluster.RunParallel(cfgs, *parallel, func(c cluster.PDConfig) (cluster.PDResult, error) { return cluster.RunPD(c, reqs) },
		func(r cluster.PDResult) {
			fmt.Fprintf(os.Stderr, "  %-5s scale %4.2f: TTFT p90 %7.3fs TPOT p90 %6.1fms SLO met %.3f (%.1fs)\n",
				r.Split, r.RateScale, r.TTFTP90, r.TPOTP90*1e3, r.SLO[0].Attainment, r.WallSeconds)
		})
	if err != nil {
		return err
	}
	rep := &cluster.PDReport{Trace: *trace, Requests: len(reqs), Workers: *gpus, GPU: base.GPU.Name, Model: base.KV.Name,
		BytesPerT: base.KV.BytesPerToken(), LinkGBps: *link, Runs: runs, Summaries: cluster.SummarisePD(runs)}
	cluster.WritePDTable(os.Stdout, rep)
	if err := write(*outDir, rep); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "wrote %s/disagg.json, disagg-tpot.png and disagg-ttft.png in %.1fs\n", *outDir, time.Since(t0).Seconds())
	return nil
}

// parseSLOs reads -slos: comma-separated TTFT/TPOT duration pairs.
func parseSLOs(list string) ([]cluster.SLO, error) {
	var out []cluster.SLO
	for _, f := range strings.Split(list, ",") {
		a, b, ok := strings.Cut(strings.TrimSpace(f), "/")
		ttft, err1 := time.ParseDuration(a)
		tpot, err2 := time.ParseDuration(b)
		if !ok || err1 != nil || err2 != nil || ttft <= 0 || tpot <= 0 {
			return nil, fmt.Errorf("-slos: bad entry %q (want e.g. 2s/100ms)", f)
		}
		out = append(out, cluster.SLO{TTFT: ttft, TPOT: tpot})
	}
	return out, nil
}

// configs is every split at every rate scale, grouped by split.
func configs(base cluster.PDConfig, splits string, rates []float64) ([]cluster.PDConfig, error) {
	var out []cluster.PDConfig
	for _, f := range strings.Split(splits, ",") {
		p, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || p < 0 || p >= base.Workers {
			return nil, fmt.Errorf("-splits: bad prefill count %q for %d GPUs", f, base.Workers)
		}
		for _, r := range rates {
			c := base
			c.Prefill, c.RateScale = p, r
			out = append(out, c)
		}
	}
	return out, nil
}

func write(dir string, rep *cluster.PDReport) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "disagg.json"), append(js, '\n'), 0o644); err != nil {
		return err
	}
	tpot, ttft := series(rep.Runs)
	name := filepath.Base(rep.Trace)
	slo := rep.Runs[0].SLO[0]
	if err := plot(filepath.Join(dir, "disagg-tpot.png"), cluster.PlotSpec{
		Title:  fmt.Sprintf("TPOT p90 vs request rate, %d GPUs aggregated vs xPyD (%s)", rep.Workers, name),
		XLabel: "request rate (req/s)", YLabel: "tpot p90 (s, log)", SLO: slo.TPOT,
		SLOLabel: fmt.Sprintf("slo %.0f ms", slo.TPOT*1e3), MinY: 0.005, MaxY: 2 * slo.TPOT}, tpot); err != nil {
		return err
	}
	return plot(filepath.Join(dir, "disagg-ttft.png"), cluster.PlotSpec{
		Title:  fmt.Sprintf("TTFT p90 vs request rate, %d GPUs aggregated vs xPyD (%s)", rep.Workers, name),
		XLabel: "request rate (req/s)", YLabel: "ttft p90 (s, log)", SLO: slo.TTFT,
		SLOLabel: fmt.Sprintf("slo %.0f s", slo.TTFT), MinY: 0.05, MaxY: 2 * slo.TTFT}, ttft)
}

// series is TPOT p90 and TTFT p90 against rate, one line per split.
func series(runs []cluster.PDResult) (tpot, ttft []cluster.Series) {
	sorted := append([]cluster.PDResult(nil), runs...)
	sort.SliceStable(sorted, func(i, j int) bool { return sorted[i].Rate < sorted[j].Rate })
	at := map[string]int{}
	for _, r := range sorted {
		i, ok := at[r.Split]
		if !ok {
			i = len(tpot)
			at[r.Split] = i
			tpot = append(tpot, cluster.Series{Name: r.Split})
			ttft = append(ttft, cluster.Series{Name: r.Split})
		}
		tpot[i].X, tpot[i].Y = append(tpot[i].X, r.Rate), append(tpot[i].Y, r.TPOTP90)
		ttft[i].X, ttft[i].Y = append(ttft[i].X, r.Rate), append(ttft[i].Y, r.TTFTP90)
	}
	return tpot, ttft
}

func plot(path string, spec cluster.PlotSpec, s []cluster.Series) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := cluster.PlotLog(f, spec, s); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
