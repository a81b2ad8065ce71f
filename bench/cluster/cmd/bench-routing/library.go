package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/oasis-llm/oasis/bench/cluster"
)

// printLibrary lists the traces with source and licence, and the generators
// with their knobs and defaults.
func printLibrary() {
	fmt.Println("traces (-trace NAME):")
	for _, t := range cluster.Traces {
		fmt.Printf("  %-22s family %-13s %s\n      source: %s, licence %s; file %s\n", t.Name, t.Family, t.Doc, t.Source, t.Licence, t.Path)
	}
	fmt.Println("generators (-trace gen:NAME[:knob=v,...]; seeded, deterministic):")
	for _, g := range cluster.Generators {
		fmt.Printf("  gen:%-18s family %-13s %s\n", g.Name, g.Family, g.Doc)
		for _, k := range g.AllKnobs() {
			fmt.Printf("      %-10s %8g  %s\n", k.Name, k.Default, k.Doc)
		}
	}
}

// runLibrary runs bench on every library entry named in list ("all": the
// whole library), each into its own folder under -out, then prints one row
// per entry: the cross-validation table.
func runLibrary(list string) error {
	names := cluster.LibraryNames()
	if list != "all" {
		names = strings.Split(list, ",")
	}
	var reps []*cluster.Report
	for _, n := range names {
		n = strings.TrimSpace(n)
		fmt.Fprintf(os.Stderr, "== %s\n", n)
		rep, err := bench(n, filepath.Join(*outDir, dirName(n)))
		if err != nil {
			return fmt.Errorf("%s: %w", n, err)
		}
		reps = append(reps, rep)
	}
	fmt.Println()
	writeCrossTable(os.Stdout, reps)
	return nil
}

// dirName turns a library spec into a folder name.
func dirName(spec string) string {
	return strings.NewReplacer(":", "-", ",", "_", "=", "", "/", "_").Replace(filepath.Base(spec))
}

// Row is one library entry's cross-validation figures.
type Row struct {
	Family, Trace string
	Oasis         float64            // throughput at SLO, offered req/s
	Peers         map[string]float64 // the same per peer
	BestPeer      string
	// TTFT p90 of Oasis at the best peer's highest SLO-meeting rate, and
	// the peer's own there.
	TTFTOasis, TTFTPeer float64
	HitOracle           float64 // Oasis's hit ratio ÷ oracle at the reference rate
	ApproxHit           float64 // Oasis without events, reference rate
	BestApproxPeer      string
	BestApproxHit       float64 // best event-less peer, reference rate
	Imbalance, JPerTok  float64 // Oasis at the reference rate
	// Ceiling is the cluster's ceiling at the TPOT SLO (cluster.Ceiling),
	// req/s: what no policy can sustain much above.
	Ceiling float64
	// Burst: Oasis's or the best peer's SLO-meeting run is burst-bound
	// (cluster.Result.BurstBound): the ratio compares how fast a burst is
	// absorbed, not sustained rates.
	Burst bool
}

func rate(b cluster.Bisection) float64 {
	if b.Scale == 0 {
		return 0
	}
	return b.Best.Rate
}

// crossRow condenses one report.
func crossRow(rep *cluster.Report) Row {
	r := Row{Family: cluster.Family(rep.Trace), Trace: rep.Trace, Peers: map[string]float64{}, Ceiling: rep.Ceiling.Rate}
	var best cluster.Bisection
	for _, b := range rep.Bisections {
		switch {
		case b.Policy == cluster.PolicyOasis:
			r.Oasis = rate(b)
			r.Burst = r.Burst || b.Best.BurstBound()
		case cluster.IsPeer(b.Policy):
			r.Peers[b.Policy] = rate(b)
			if best.Policy == "" || b.Scale > best.Scale {
				best = b
			}
		}
	}
	r.BestPeer = best.Policy
	r.Burst = r.Burst || best.Best.BurstBound()
	r.TTFTPeer = best.Best.TTFTP90
	if len(rep.PeerVariants) > 0 && best.Scale > 0 {
		r.TTFTOasis = rep.PeerVariants[0].TTFTP90
	}
	for _, s := range rep.Summaries {
		if s.Policy == cluster.PolicyOasis && s.OracleHitRatio > 0 {
			r.HitOracle = s.HitRatio / s.OracleHitRatio
			r.Imbalance, r.JPerTok = s.Imbalance, s.JoulesPerToken
		}
	}
	for _, v := range rep.PeerVariants[min(1, len(rep.PeerVariants)):] {
		switch {
		case v.Learning != cluster.LearnApprox:
		case v.Policy == cluster.PolicyOasis:
			r.ApproxHit = v.HitRatio
		case v.HitRatio > r.BestApproxHit:
			r.BestApproxPeer, r.BestApproxHit = v.Policy, v.HitRatio
		}
	}
	return r
}

// writeCrossTable prints the cross-validation table, one row per report.
func writeCrossTable(w *os.File, reps []*cluster.Report) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "family\ttrace\toasis r/s\t%s\tbest peer\t×best\tceiling r/s\toasis/peer ÷ceiling\tTTFT p90 oasis/peer\thit÷oracle\tno-events hit oasis/best peer\timbalance\tJ/tok\n", strings.Join(cluster.PeerPolicies, "\t"))
	for _, rep := range reps {
		r := crossRow(rep)
		var peers []string
		for _, p := range cluster.PeerPolicies {
			peers = append(peers, fmt.Sprintf("%.2f", r.Peers[p]))
		}
		ratio := "—"
		if r.Peers[r.BestPeer] > 0 {
			ratio = fmt.Sprintf("%.2f", r.Oasis/r.Peers[r.BestPeer])
		}
		if r.Burst {
			ratio += " (burst-bound)"
		}
		share := "—"
		if r.Ceiling > 0 {
			share = fmt.Sprintf("%.2f/%.2f", r.Oasis/r.Ceiling, r.Peers[r.BestPeer]/r.Ceiling)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.2f\t%s\t%s\t%s\t%.2f\t%s\t%.2f/%.2f s\t%.2f\t%.3f/%.3f (%s)\t%.2f\t%.3f\n", r.Family, r.Trace, r.Oasis, strings.Join(peers, "\t"),
			r.BestPeer, ratio, r.Ceiling, share, r.TTFTOasis, r.TTFTPeer, r.HitOracle, r.ApproxHit, r.BestApproxHit, r.BestApproxPeer, r.Imbalance, r.JPerTok)
	}
	tw.Flush()
}
