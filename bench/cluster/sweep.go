package cluster

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// RunParallel runs run over every configuration, at most parallel at once,
// calls done with each result as it finishes (progress lines), and returns
// the results in the configurations' order, or the first error.
func RunParallel[C, R any](cfgs []C, parallel int, run func(C) (R, error), done func(R)) ([]R, error) {
	out := make([]R, len(cfgs))
	errs := make([]error, len(cfgs))
	sem := make(chan struct{}, max(1, parallel))
	var wg sync.WaitGroup
	var mu sync.Mutex // done prints: one line at a time
	for i, c := range cfgs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i], errs[i] = run(c)
			if errs[i] == nil && done != nil {
				mu.Lock()
				done(out[i])
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ParseScales reads a -scales flag: comma-separated rate scales above 0,
// returned in increasing order.
func ParseScales(list string) ([]float64, error) {
	var rates []float64
	for _, s := range strings.Split(list, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("-scales: bad value %q", s)
		}
		rates = append(rates, v)
	}
	slices.Sort(rates)
	return rates, nil
}

// ParseWeights reads a -weights list (name=value,...); empty: nil (the
// policy's defaults).
func ParseWeights(list string) (map[string]float64, error) {
	if list == "" {
		return nil, nil
	}
	w := map[string]float64{}
	for _, kv := range strings.Split(list, ",") {
		k, v, ok := strings.Cut(kv, "=")
		f, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("-weights: bad entry %q", kv)
		}
		w[strings.TrimSpace(k)] = f
	}
	return w, nil
}
