// Command bench-routing replays a request trace (Mooncake JSONL format) or a
// synthetic shared-prefix workload through the cluster simulator for every
// routing policy and a sweep of request rates, and writes a table (stdout),
// JSON (routing.json) and a plot of TTFT p90 versus rate (routing.png).
//
//	go run ./bench/cluster/cmd/bench-routing -trace bench/cluster/traces/mooncake-conversation.jsonl.gz -workers 16
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/oasis-llm/oasis/bench/cluster"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-routing:", err)
		os.Exit(1)
	}
}

var (
	trace       = flag.String("trace", "bench/cluster/traces/mooncake-conversation.jsonl.gz", "trace: a library name ("+strings.Join(cluster.LibraryNames(), ", ")+"), a generator gen:NAME[:knob=v,...], or a file in the Mooncake JSONL format (.gz read gunzipped)")
	synthetic   = flag.Bool("synthetic", false, "use the synthetic shared-prefix generator instead of -trace")
	groups      = flag.Int("syn-groups", 32, "synthetic: prefix groups")
	perGroup    = flag.Int("syn-prompts", 64, "synthetic: conversations per group")
	sysBlocks   = flag.Int("syn-system-blocks", 4, "synthetic: system prompt length in 512-token blocks")
	turns       = flag.Int("syn-turns", 3, "synthetic: turns per conversation")
	zipf        = flag.Float64("syn-zipf", 1.2, "synthetic: Zipf exponent of group popularity (>1; 0 uniform)")
	synRate     = flag.Float64("syn-rate", 4, "synthetic: conversation starts per second at scale 1")
	workers     = flag.Int("workers", 16, "workers in the cluster")
	homogeneous = flag.Bool("homogeneous", false, "all H100 instead of the heterogeneous H100/A100/L40S mix")
	scales      = flag.String("scales", "0.5,1,2,3,4", "rate scales to sweep (arrival time / scale)")
	policies    = flag.String("policies", strings.Join(append(slices.Clone(cluster.Policies), cluster.PeerPolicies...), ","), "policies to compare (peers: "+strings.Join(cluster.PeerPolicies, ",")+")")
	bisect      = flag.Int("bisect", 4, "bisection steps per policy for the highest rate meeting the SLO (0: no bisection, no peer targets)")
	maxScale    = flag.Float64("max-scale", 64, "bisection: highest rate scale tried")
	sloTTFT     = flag.Duration("slo-ttft", 2*time.Second, "SLO: TTFT p90")
	sloTPOT     = flag.Duration("slo-tpot", 100*time.Millisecond, "SLO: TPOT p90")
	dynTemp     = flag.Float64("dynamo-temperature", 0, "dynamo peer: router_temperature (0, its default: lowest cost)")
	learning    = flag.String("learning", cluster.LearnEvents, "cache learning of prefix policies: events or approx")
	delay       = flag.Duration("event-delay", 0, "KV event delivery delay")
	loss        = flag.Float64("event-loss", 0, "probability of losing one KV event batch")
	replay      = flag.Bool("event-replay", true, "fill event sequence gaps from the engine's replay buffer instead of resynchronising")
	variants    = flag.Bool("variants", true, "also run oasis at the reference rate with approximate learning, and with events delayed 100 ms and 1% lost (with and without replay)")
	blockSize   = flag.Int("block-size", 16, "engine block size in tokens")
	limit       = flag.Int("limit", 0, "use only the first N requests (0: all)")
	outDir      = flag.String("out", "bench/out", "directory for routing.json and routing.png")
	weights     = flag.String("weights", "", "oasis policy weights, e.g. prefix=2,load=1,power=0.2 (default cluster.DefaultOasisWeights)")
	slack       = flag.Float64("load-slack", 0, "prefix term hot-spot guard ε for oasis (0: default)")
	inflightTTL = flag.Duration("inflight-ttl", 0, "with KV events, how long oasis counts its own decision as held before the events confirm it (0: the router's default; negative: events alone)")
	recompute   = flag.Float64("recompute", 0, "ttft term κ for oasis: the share of the recompute a move away from the prefix holder adds that is charged (0: default; negative: none)")
	inflightRe  = flag.Float64("inflight-recompute", 0, "ttft term κ_f for oasis with KV events: the charge for tokens only the router's in-flight record holds (0: default; negative: none)")
	cpuGiB      = flag.Float64("cpu-gib", 0, "host memory per worker for a CPU KV offloading tier, GiB (0: none)")
	diskGiB     = flag.Float64("disk-gib", 0, "SSD per worker for an oasis-kvcached disk KV tier below the CPU tier, GiB (0: none)")
	decodePower = flag.Float64("decode-power", 0, "power model: a decode step's dynamic power at batch 1 as a fraction of full, rising to full at batch 64 (0: every step draws full power)")
	kvScale     = flag.Float64("kv-scale", 1, "multiply every worker's KV capacity (diagnostics: large = nearly infinite cache)")
	cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of the whole run to this file")
	parallel    = flag.Int("parallel", runtime.NumCPU(), "simulations run at once")
	list        = flag.Bool("list", false, "print the trace library (traces with source and licence, generators with their knobs) and exit")
	library     = flag.String("library", "", "run every library entry (\"all\") or a comma-separated list of them, each into -out/<name>/, then print the cross-validation table")
)

func run() error {
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}

	if *list {
		printLibrary()
		return nil
	}
	if *library != "" {
		return runLibrary(*library)
	}
	_, err := bench(*trace, *outDir)
	return err
}

// bench runs every configured policy on one trace and writes its table,
// routing.json and routing.png into outDir.
func bench(spec, outDir string) (*cluster.Report, error) {
	var reqs []*cluster.Request
	name := spec
	if *synthetic {
		name = fmt.Sprintf("synthetic(groups=%d,prompts=%d,system=%d,turns=%d,zipf=%.2f,rate=%.1f)", *groups, *perGroup, *sysBlocks, *turns, *zipf, *synRate)
		reqs = cluster.Synthetic(cluster.SyntheticConfig{Groups: *groups, PromptsPerGrp: *perGroup, SystemBlocks: *sysBlocks, UserBlocks: 1,
			Turns: *turns, Zipf: *zipf, Rate: *synRate, ThinkSeconds: 30, OutputTokens: 256, SharedSysBlock: true, Seed: 1})
	} else {
		var err error
		if reqs, err = cluster.LoadSpec(spec); err != nil {
			return nil, err
		}
	}
	if *limit > 0 && *limit < len(reqs) {
		reqs = reqs[:*limit]
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("no requests")
	}
	gpus, clusterName := clusterGPUs(*workers, *homogeneous, *cpuGiB, *diskGiB, *kvScale, *blockSize)
	w, err := cluster.ParseWeights(*weights)
	if err != nil {
		return nil, err
	}
	rates, err := cluster.ParseScales(*scales)
	if err != nil {
		return nil, err
	}
	pols := strings.Split(*policies, ",")

	t0 := time.Now()
	if err := cluster.Keys(reqs, "mooncake", *blockSize); err != nil {
		return nil, err
	}
	oracle := cluster.OracleHitRatio(reqs, *blockSize)
	fmt.Fprintf(os.Stderr, "%d requests, %.0f s at scale 1; block keys in %.1fs; oracle hit ratio %.3f\n", len(reqs), cluster.Span(reqs), time.Since(t0).Seconds(), oracle)
	ceil := cluster.CeilingOf(reqs, gpus, *blockSize, *sloTPOT)
	fmt.Fprintf(os.Stderr, "ceiling at TPOT %s: %.2f r/s (scale %.3f); without step overhead %.2f r/s (scale %.3f)\n", *sloTPOT, ceil.Rate, ceil.Scale, ceil.WorkRate, ceil.WorkScale)

	base := cluster.Config{GPUs: gpus, Learning: *learning, EventDelay: *delay, EventLoss: *loss, EventReplay: *replay, BlockSize: *blockSize, Seed: 1, Weights: w, LoadSlack: *slack, Recompute: *recompute, InflightRecompute: *inflightRe, InflightTTL: *inflightTTL, DecodePower: *decodePower, DynamoTemperature: *dynTemp}
	var cfgs []cluster.Config
	for _, r := range rates {
		for _, p := range pols {
			c := base
			c.Policy, c.RateScale = strings.TrimSpace(p), r
			cfgs = append(cfgs, c)
		}
	}
	runs, err := runAll(cfgs, reqs, *parallel)
	if err != nil {
		return nil, err
	}
	for i := range runs {
		runs[i].OracleHitRatio = oracle
	}
	rep := &cluster.Report{Trace: name, Requests: len(reqs), Workers: *workers, Cluster: clusterName, BlockSize: *blockSize,
		OracleHitRatio: oracle, ReferenceScale: cluster.ReferenceScale(runs), Runs: runs, Ceiling: ceil}
	rep.Summaries = cluster.Summarise(runs, oracle)
	rep.Targets = cluster.Targets(rep.Summaries, runs)
	rep.SLO = cluster.RoutingSLO{TTFTP90: sloTTFT.Seconds(), TPOTP90: sloTPOT.Seconds()}
	if *bisect > 0 {
		if err := peerStage(rep, base, pols, reqs, *bisect, *parallel, *maxScale); err != nil {
			return nil, err
		}
	}
	if *variants {
		ref := rep.ReferenceScale
		a := base
		a.Policy, a.RateScale, a.Learning = cluster.PolicyOasis, ref, cluster.LearnApprox
		b := base
		b.Policy, b.RateScale, b.Learning, b.EventDelay, b.EventLoss, b.EventReplay = cluster.PolicyOasis, ref, cluster.LearnEvents, 100*time.Millisecond, 0.01, true
		c := b
		c.EventReplay = false
		extra, err := runAll([]cluster.Config{a, b, c}, reqs, *parallel)
		if err != nil {
			return nil, err
		}
		for i := range extra {
			extra[i].OracleHitRatio = oracle
		}
		rep.Extra = extra
	}

	cluster.WriteTable(os.Stdout, rep)
	writePeers(rep)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return nil, err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(outDir, "routing.json"), append(js, '\n'), 0o644); err != nil {
		return nil, err
	}
	f, err := os.Create(filepath.Join(outDir, "routing.png"))
	if err != nil {
		return nil, err
	}
	title := fmt.Sprintf("TTFT p90 vs request rate, %d workers (%s)", *workers, filepath.Base(name))
	plotted := slices.Clone(runs)
	for _, b := range rep.Bisections {
		plotted = append(plotted, b.Runs...)
	}
	if err := cluster.PlotTTFT(f, title, plotted); err != nil {
		f.Close()
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "wrote %s and %s in %.1fs\n", filepath.Join(outDir, "routing.json"), filepath.Join(outDir, "routing.png"), time.Since(t0).Seconds())
	return rep, nil
}

func runAll(cfgs []cluster.Config, reqs []*cluster.Request, parallel int) ([]cluster.Result, error) {
	out, err := cluster.RunParallel(cfgs, parallel, func(c cluster.Config) (cluster.Result, error) { return cluster.Run(c, reqs) },
		func(r cluster.Result) {
			fmt.Fprintf(os.Stderr, "  %-11s %-6s scale %5.2f: hit %.3f TTFT p90 %8.3fs done %6.2f r/s imbalance %.2f J/tok %.3f (%.1fs)\n",
				r.Policy, r.Learning, r.RateScale, r.HitRatio, r.TTFTP90, r.Throughput, r.Imbalance, r.JoulesPerToken, r.WallSeconds)
		})
	if err != nil {
		return nil, err
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].RateScale < out[j].RateScale })
	return out, nil
}

// clusterGPUs builds the workers' GPUs (the heterogeneous mix, or all H100)
// with their offloading tiers, and names the cluster.
func clusterGPUs(workers int, homogeneous bool, cpuGiB, diskGiB, kvScale float64, blockSize int) ([]cluster.GPU, string) {
	gpus := cluster.Heterogeneous(workers)
	name := "heterogeneous H100/A100/H100/L40S"
	if homogeneous {
		name = "homogeneous H100"
		for i := range gpus {
			gpus[i] = cluster.H100
		}
	}
	if cpuGiB > 0 {
		name += fmt.Sprintf(", %.0f GiB CPU KV tier per worker", cpuGiB)
	}
	if diskGiB > 0 {
		name += fmt.Sprintf(", %.0f GiB disk KV tier per worker", diskGiB)
	}
	for i := range gpus {
		gpus[i].Blocks = int(float64(gpus[i].Blocks) * kvScale)
		gpus[i].CPUBlocks = cluster.BlocksForGiB(cpuGiB, blockSize)
		gpus[i].DiskBlocks = cluster.BlocksForGiB(diskGiB, blockSize)
	}
	return gpus, name
}
