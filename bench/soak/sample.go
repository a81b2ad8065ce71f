package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// sample is one reading of the router's and kvcached's footprint.
type sample struct {
	At               time.Duration `json:"at"`
	RouterRSS        int64         `json:"router_rss"`
	RouterGoroutines int64         `json:"router_goroutines"`
	KVRSS            int64         `json:"kvcached_rss"`
	KVGoroutines     int64         `json:"kvcached_goroutines"`
}

// report is what a soak run found.
type report struct {
	Duration string           `json:"duration"`
	Workers  int              `json:"workers"`
	Samples  []sample         `json:"samples"`
	Outcomes map[string]int64 `json:"outcomes"`
}

func sampleUntil(ctx context.Context, t targets, every time.Duration) []sample {
	start := time.Now()
	c := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var out []sample
	for {
		out = append(out, sample{At: time.Since(start).Round(time.Second),
			RouterRSS: rssBytes(pidOf(t.routerBin)), RouterGoroutines: goroutines(c, t.routerURL+"/metrics"),
			KVRSS: rssBytes(pidOf(t.kvcachedBin)), KVGoroutines: goroutines(c, "http://"+t.kvcachedHTTP+"/metrics")})
		select {
		case <-ctx.Done():
			return out
		case <-tick.C:
		}
	}
}

// goroutines reads go_goroutines from a Prometheus endpoint, 0 when it
// cannot.
func goroutines(c *http.Client, url string) int64 {
	resp, err := c.Get(url)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(io.LimitReader(resp.Body, 4<<20))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int64(n)
		}
	}
	return 0
}

// Growth that fails the soak: the last third of the samples (after a
// quarter of warm-up) averaging more than growthRatio times the first
// third, and by more than the floor (so a small absolute drift of a small
// number does not count).
const growthRatio = 1.5

type series struct {
	name  string
	floor float64
	get   func(sample) int64
}

// checked are the series the verdict judges.
func checked() []series {
	return []series{
		{"router RSS", 64 << 20, func(s sample) int64 { return s.RouterRSS }},
		{"router goroutines", 500, func(s sample) int64 { return s.RouterGoroutines }},
		{"kvcached RSS", 64 << 20, func(s sample) int64 { return s.KVRSS }},
		{"kvcached goroutines", 500, func(s sample) int64 { return s.KVGoroutines }},
	}
}

// growth returns the first-third and last-third means of the samples after
// warm-up, and whether there were enough to judge.
func growth(samples []sample, get func(sample) int64) (first, last float64, ok bool) {
	rest := samples[len(samples)/4:]
	if len(rest) < 6 {
		return 0, 0, false
	}
	third := len(rest) / 3
	mean := func(ss []sample) float64 {
		var sum float64
		for _, s := range ss {
			sum += float64(get(s))
		}
		return sum / float64(len(ss))
	}
	return mean(rest[:third]), mean(rest[len(rest)-third:]), true
}

// verdict lists what fails the soak.
func (r *report) verdict() []string {
	var faults []string
	for _, c := range checked() {
		first, last, ok := growth(r.Samples, c.get)
		if !ok {
			faults = append(faults, "too few samples to judge "+c.name+" (run longer or sample more often)")
			continue
		}
		if last > first*growthRatio && last-first > c.floor {
			faults = append(faults, fmt.Sprintf("%s grows: %.0f → %.0f", c.name, first, last))
		}
	}
	for k, n := range r.Outcomes {
		if n > 0 && (strings.HasSuffix(k, "/lost") || strings.HasSuffix(k, "/corrupt") || strings.Contains(k, "/unexpected")) {
			faults = append(faults, fmt.Sprintf("%d × %s", n, k))
		}
	}
	slices.Sort(faults)
	return faults
}

func (r *report) print(w io.Writer) {
	fmt.Fprintf(w, "\nrequests by kind/outcome (%s, %d clients):\n", r.Duration, r.Workers)
	keys := make([]string, 0, len(r.Outcomes))
	for k := range r.Outcomes {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "  %-40s %8d\n", k, r.Outcomes[k])
	}
	fmt.Fprintf(w, "\n%8s %12s %10s %12s %10s\n", "at", "router MiB", "router gr", "kvcached MiB", "kvcached gr")
	for _, s := range r.Samples {
		fmt.Fprintf(w, "%8s %12.1f %10d %12.1f %10d\n", s.At, float64(s.RouterRSS)/(1<<20), s.RouterGoroutines,
			float64(s.KVRSS)/(1<<20), s.KVGoroutines)
	}
	for _, c := range checked() {
		if first, last, ok := growth(r.Samples, c.get); ok {
			fmt.Fprintf(w, "%s: %.0f → %.0f (first → last third after warm-up)\n", c.name, first, last)
		}
	}
}
