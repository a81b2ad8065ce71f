package main

import (
	"fmt"
	"os"
	"slices"

	"github.com/oasis-llm/oasis/bench/cluster"
)

// peerStage runs the peer comparison after the sweep: each policy's highest
// SLO-meeting rate by bisection (policies in parallel, each bisection in
// order), Oasis at the best peer's rate, and the approximate-learning modes
// at the reference rate; it fills rep's peer fields.
func peerStage(rep *cluster.Report, base cluster.Config, pols []string, reqs []*cluster.Request, steps, parallel int, maxScale float64) error {
	slo := rep.SLO
	type job struct{ policy string }
	jobs := make([]job, 0, len(pols))
	for _, p := range pols {
		jobs = append(jobs, job{p})
	}
	bs, err := cluster.RunParallel(jobs, parallel, func(j job) (cluster.Bisection, error) {
		var swept []cluster.Result
		for _, r := range rep.Runs {
			if r.Policy == j.policy {
				swept = append(swept, r)
			}
		}
		b, err := cluster.Bisect(swept, slo, steps, maxScale, func(x float64) (cluster.Result, error) {
			c := base
			c.Policy, c.RateScale = j.policy, x
			r, err := cluster.Run(c, reqs)
			if err == nil {
				r.OracleHitRatio = rep.OracleHitRatio
				progress(r)
			}
			return r, err
		})
		b.Policy = j.policy
		b.Learning = b.Best.Learning
		return b, err
	}, nil)
	if err != nil {
		return err
	}
	rep.Bisections = bs
	return peerVariants(rep, base, reqs, parallel)
}

// peerVariants runs Oasis at the best peer's highest SLO-meeting rate and the
// event-capable policies with approximate learning at the reference rate,
// then evaluates the peer targets.
func peerVariants(rep *cluster.Report, base cluster.Config, reqs []*cluster.Request, parallel int) error {
	peer, ok := cluster.BestPeer(rep.Bisections)
	if !ok {
		return nil
	}
	var cfgs []cluster.Config
	at := base
	at.Policy, at.RateScale = cluster.PolicyOasis, peer.Scale
	if peer.Scale == 0 {
		at.RateScale = rep.ReferenceScale
	}
	cfgs = append(cfgs, at)
	for _, p := range []string{cluster.PolicyOasis, cluster.PolicyLLMD, cluster.PolicyDynamo} {
		c := base
		c.Policy, c.RateScale, c.Learning = p, rep.ReferenceScale, cluster.LearnApprox
		cfgs = append(cfgs, c)
	}
	out, err := cluster.RunParallel(cfgs, parallel, func(c cluster.Config) (cluster.Result, error) { return cluster.Run(c, reqs) }, progress)
	if err != nil {
		return err
	}
	for i := range out {
		out[i].OracleHitRatio = rep.OracleHitRatio
	}
	variants := slices.Clone(out[1:])
	for _, r := range rep.Runs { // the peers that only learn approximately
		if r.RateScale == rep.ReferenceScale && cluster.IsPeer(r.Policy) && r.Learning == cluster.LearnApprox {
			variants = append(variants, r)
		}
	}
	rep.PeerVariants = append([]cluster.Result{out[0]}, variants...)
	rep.PeerTargets = cluster.PeerTargets(rep.Bisections, out[0], rep.Summaries, variants, rep.SLO)
	return nil
}

func progress(r cluster.Result) {
	fmt.Fprintf(os.Stderr, "  %-11s %-6s scale %6.3f: hit %.3f TTFT p90 %8.3fs TPOT p90 %6.1fms done %6.2f r/s imbalance %.2f (%.1fs)\n",
		r.Policy, r.Learning, r.RateScale, r.HitRatio, r.TTFTP90, r.TPOTP90*1000, r.Throughput, r.Imbalance, r.WallSeconds)
}

// writePeers prints the bisection table and the peer targets.
func writePeers(rep *cluster.Report) {
	if len(rep.Bisections) == 0 {
		return
	}
	cluster.WriteBisections(os.Stdout, rep.SLO, rep.Ceiling, rep.Bisections)
	fmt.Println()
	for _, r := range rep.PeerVariants {
		fmt.Printf("variant %-10s %-6s scale %.3f: hit %.3f TTFT p90 %.3f s TPOT p90 %.1f ms\n", r.Policy, r.Learning, r.RateScale, r.HitRatio, r.TTFTP90, r.TPOTP90*1000)
	}
	fmt.Println()
	for _, t := range rep.PeerTargets {
		met := "NOT MET"
		if t.Met {
			met = "met"
		}
		fmt.Printf("target %-58s goal %-7s measured %.3f  %s\n", t.Name, t.Goal, t.Measured, met)
	}
}
