package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
)

// sweep measures decision latency and memory per (block, worker) entry for
// every worker count × distinct block count, Oasis's index always and
// llm-d's where its ~1 KB per entry fits this machine (maxLLMD entries, up
// to maxLLMDWorkers workers), in the same process.
func sweep(workerList, blockList string, blocks, shared, lookups, maxLLMD, maxLLMDWorkers int, profDir string) error {
	ws, err := ints(workerList)
	if err != nil {
		return err
	}
	bs, err := ints(blockList)
	if err != nil {
		return err
	}
	fmt.Printf("decision scaling: prompts of %d blocks (%d shared by all), %d lookups, GOMAXPROCS=1\n", blocks, shared, lookups)
	fmt.Printf("%-8s %-9s %-28s %10s %9s %10s %10s %8s\n", "workers", "blocks", "index", "entries", "B/entry", "p50", "p99", "correct")
	for _, nb := range bs {
		for _, nw := range ws {
			prompts := max(1, (nb-shared)/(blocks-shared))
			w := newWorkload(nw, prompts, blocks, shared)
			prof := ""
			if profDir != "" {
				prof = filepath.Join(profDir, fmt.Sprintf("oasis-%d-%d.pprof", nw, nb))
			}
			row(nw, nb, measure(w, func() index { return newOasis(w) }, lookups, prof))
			entries := prompts*(blocks-shared) + min(prompts, nw)*shared
			if entries <= maxLLMD && nw <= maxLLMDWorkers { // its lookups take milliseconds: a fifth as many
				row(nw, nb, measure(w, func() index { return newLLMD(w) }, max(100, lookups/5), ""))
			}
		}
	}
	return nil
}

func row(workers, blocks int, r result) {
	fmt.Printf("%-8d %-9d %-28s %10d %9.1f %10v %10v %4d/%d\n", workers, blocks, r.name, r.entries, r.bytesPerEntry, r.p50, r.p99, r.correct, r.checkedBest)
}

func ints(list string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
		if err != nil || v < 1 {
			return nil, fmt.Errorf("bad count %q", f)
		}
		out = append(out, int(v))
	}
	return out, nil
}

// startProfile profiles the CPU into path until the returned stop is called
// (nothing when path is empty).
func startProfile(path string) (stop func()) {
	if path == "" {
		return func() {}
	}
	f, err := os.Create(path)
	if err != nil {
		fmt.Fprintln(os.Stderr, "profile:", err)
		return func() {}
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		fmt.Fprintln(os.Stderr, "profile:", err)
		return func() {}
	}
	return func() { pprof.StopCPUProfile(); f.Close() }
}
