// Command bench-routers replays a request trace through the cluster
// simulator with N Oasis routers sharing the workers (the system job's one
// router per node, each receiving its share of the arrivals) and compares
// throughput at SLO and hit ratio with 1, 4 and 16 routers, with KV events
// and with approximate learning, with the routers' shared state off, loads
// shared (router/peers' messages: on change, at most every 10 ms, at
// least every 200 ms) and, for approximate
// learning, prefix records shared too. Writes a table (stdout) and
// routers.json.
//
//	go run ./bench/cluster/cmd/bench-routers -trace mooncake-conversation -workers 16 -routers 1,4,16
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/oasis-llm/oasis/bench/cluster"
	"github.com/oasis-llm/oasis/router/peers"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench-routers:", err)
		os.Exit(1)
	}
}

var (
	trace    = flag.String("trace", "mooncake-conversation", "trace: a library name, gen:NAME[:knobs] or a Mooncake JSONL file")
	workers  = flag.Int("workers", 16, "workers (H100) in the cluster")
	routers  = flag.String("routers", "1,4,16", "router counts to compare (the first is the reference)")
	learning = flag.String("learning", "events,approx", "cache learning modes: events, approx")
	scales   = flag.String("scales", "1,2,4", "rate scales swept before bisection")
	bisect   = flag.Int("bisect", 4, "bisection steps for the highest rate meeting the SLO")
	maxScale = flag.Float64("max-scale", 64, "bisection: highest rate scale tried")
	interval = flag.Duration("interval", peers.DefaultInterval, "the longest time between two load messages of a router (router/peers' -peers-interval)")
	minIv    = flag.Duration("min-interval", peers.DefaultMinInterval, "the shortest time between two load messages of a router: it sends on change (router/peers' -peers-min-interval)")
	delay    = flag.Duration("peer-delay", cluster.DefaultPeerDelay, "a load message's delivery time")
	limit    = flag.Int("limit", 0, "use only the first N requests (0: all)")
	parallel = flag.Int("parallel", runtime.NumCPU(), "configurations bisected at once")
	outDir   = flag.String("out", "bench/out", "directory for routers.json")
	weights  = flag.String("weights", "", "oasis policy weights, e.g. ttft=2,prefix=1,load=0.2 (default: the policy's)")
	spread   = flag.Bool("spread-ties", true, "spread requests that share a trace timestamp over the time to the next one (cluster.SpreadTies; false: simultaneous)")
	oracle   = flag.Bool("oracle", false, "also a row per router count with one worker.Live shared by all routers (the upper bound of sharing; no router does this)")
)

// row is one configuration's throughput at SLO.
type row struct {
	Routers  int    `json:"routers"`
	Learning string `json:"learning"`
	Sharing  string `json:"sharing"` // off, loads, loads+prefixes, oracle ("-" for one router)
	// VsOne is the rate at SLO over one router's with the same learning.
	VsOne     float64           `json:"vs_one_router"`
	Bisection cluster.Bisection `json:"bisection"`
}

type report struct {
	Trace    string             `json:"trace"`
	Weights  map[string]float64 `json:"weights,omitempty"` // nil: the policy's defaults
	Requests int                `json:"requests"`
	Workers  int                `json:"workers"`
	Interval string             `json:"interval"`
	MinIv    string             `json:"min_interval"`
	Delay    string             `json:"peer_delay"`
	SLO      cluster.RoutingSLO `json:"slo"`
	Rows     []row              `json:"rows"`
}

func run() error {
	flag.Parse()
	reqs, err := cluster.LoadSpec(*trace)
	if err != nil {
		return err
	}
	if *limit > 0 && *limit < len(reqs) {
		reqs = reqs[:*limit]
	}
	if len(reqs) == 0 {
		return fmt.Errorf("no requests")
	}
	if err := cluster.Keys(reqs, "mooncake", 16); err != nil {
		return err
	}
	if *spread {
		reqs = cluster.SpreadTies(reqs)
	}
	swept, err := cluster.ParseScales(*scales)
	if err != nil {
		return err
	}
	rows, err := configs()
	if err != nil {
		return err
	}
	w, err := cluster.ParseWeights(*weights)
	if err != nil {
		return err
	}
	slo := cluster.DefaultRoutingSLO()
	t0 := time.Now()
	rows, err = cluster.RunParallel(rows, *parallel, func(r row) (row, error) {
		var err error
		r.Bisection, err = bisectRow(r, reqs, swept, slo, w)
		return r, err
	}, func(r row) {
		fmt.Fprintf(os.Stderr, "  %2d routers %-6s %-14s: %.2f r/s at SLO, hit %.3f (%.0fs so far)\n", r.Routers, r.Learning, r.Sharing,
			r.Bisection.Best.Rate, r.Bisection.Best.HitRatio, time.Since(t0).Seconds())
	})
	if err != nil {
		return err
	}
	relate(rows)
	rep := report{Weights: w, Trace: *trace, Requests: len(reqs), Workers: *workers, Interval: interval.String(), MinIv: minIv.String(), Delay: delay.String(), SLO: slo, Rows: rows}
	write(rep)
	if err := os.MkdirAll(*outDir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(*outDir, "routers.json"), append(js, '\n'), 0o644)
}

// configs are the rows to measure: each router count with each learning
// mode; beyond one router, sharing off and loads shared, and for
// approximate learning loads and prefix records shared.
func configs() ([]row, error) {
	var rows []row
	for _, ns := range strings.Split(*routers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(ns))
		if err != nil || n < 1 {
			return nil, fmt.Errorf("-routers: bad count %q", ns)
		}
		for _, l := range strings.Split(*learning, ",") {
			l = strings.TrimSpace(l)
			if l != cluster.LearnEvents && l != cluster.LearnApprox {
				return nil, fmt.Errorf("-learning: %q: want events or approx", l)
			}
			if n == 1 {
				rows = append(rows, row{Routers: 1, Learning: l, Sharing: "-"})
				continue
			}
			rows = append(rows, row{Routers: n, Learning: l, Sharing: "off"}, row{Routers: n, Learning: l, Sharing: "loads"})
			if *oracle {
				rows = append(rows, row{Routers: n, Learning: l, Sharing: "oracle"})
			}
			if l == cluster.LearnApprox {
				rows = append(rows, row{Routers: n, Learning: l, Sharing: "loads+prefixes"})
			}
		}
	}
	return rows, nil
}

// bisectRow finds r's highest rate meeting slo: the sweep, then bisection.
func bisectRow(r row, reqs []*cluster.Request, swept []float64, slo cluster.RoutingSLO, weights map[string]float64) (cluster.Bisection, error) {
	gpus := make([]cluster.GPU, *workers)
	for i := range gpus {
		gpus[i] = cluster.H100
	}
	cfg := cluster.Config{GPUs: gpus, Policy: cluster.PolicyOasis, Weights: weights, Learning: r.Learning, BlockSize: 16, Seed: 1,
		Routers: r.Routers, ShareLoads: strings.HasPrefix(r.Sharing, "loads"), SharePrefixes: r.Sharing == "loads+prefixes",
		ShareSignals: r.Sharing == "oracle",
		PeerInterval: *interval, PeerMinInterval: *minIv, PeerDelay: *delay}
	at := func(scale float64) (cluster.Result, error) {
		c := cfg
		c.RateScale = scale
		return cluster.Run(c, reqs)
	}
	var runs []cluster.Result
	for _, s := range swept {
		res, err := at(s)
		if err != nil {
			return cluster.Bisection{}, err
		}
		runs = append(runs, res)
	}
	b, err := cluster.Bisect(runs, slo, *bisect, *maxScale, at)
	b.Runs = append(runs, b.Runs...)
	return b, err
}

// relate fills each row's ratio to one router with the same learning.
func relate(rows []row) {
	one := map[string]float64{}
	for _, r := range rows {
		if r.Routers == 1 {
			one[r.Learning] = r.Bisection.Best.Rate
		}
	}
	for i := range rows {
		if base := one[rows[i].Learning]; base > 0 {
			rows[i].VsOne = rows[i].Bisection.Best.Rate / base
		}
	}
}

func write(rep report) {
	fmt.Printf("%s, %d requests, %d H100 workers, load messages on change, every %s to %s, delivered in %s; SLO TTFT p90 <= %.1f s, TPOT p90 <= %.0f ms\n",
		rep.Trace, rep.Requests, rep.Workers, rep.MinIv, rep.Interval, rep.Delay, rep.SLO.TTFTP90, rep.SLO.TPOTP90*1000)
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "routers\tlearning\tsharing\trate at SLO r/s\tvs 1 router\thit\tTTFT p90 s\tfailed at scale\tmsgs/s/router\tbytes/msg\t\n")
	for _, r := range rep.Rows {
		b := r.Bisection
		rate, size := gossipCost(b.Best)
		fmt.Fprintf(tw, "%d\t%s\t%s\t%.2f\t%.3f\t%.3f\t%.3f\t%.3f\t%.1f\t%.0f\t\n", r.Routers, r.Learning, r.Sharing, b.Best.Rate, r.VsOne,
			b.Best.HitRatio, b.Best.TTFTP90, b.FailScale, rate, size)
	}
	tw.Flush()
}

// gossipCost is a run's load messages a second per router (each goes to
// every other router) and their mean size in bytes.
func gossipCost(r cluster.Result) (perSecond, bytes float64) {
	if r.PeerMessages == 0 || r.Routers == 0 || r.Makespan <= 0 {
		return 0, 0
	}
	return float64(r.PeerMessages) / float64(r.Routers) / r.Makespan, float64(r.PeerBytes) / float64(r.PeerMessages)
}
