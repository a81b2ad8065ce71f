// Command routerload measures oasis-router against calling engines directly
// and against another reverse proxy (nginx), side by side in one run.
//
// Latency phase: open-loop streaming requests at a fixed rate, rotating
// between targets in short rounds so machine noise hits every target alike;
// reports time to first token (the first event that carries one) and to end
// of stream per target, and the router's added latency (router − direct) at
// p50/p90/p99. Time to first event is reported beside it: engines send a
// role-only chunk at once, which the router holds until a token comes (see
// router/gateway/hold.go), so the first event is comparable between targets
// only as far as they forward it.
//
// Throughput phase: closed-loop, C concurrent streaming clients per target for
// a fixed time, rotated the same way; reports completed requests per second
// and the ratio between targets.
//
// Targets are http:// or https://. Each target has its own client (own
// connection pool): HTTP/1.1 with keep-alive; to https targets TLS with the
// CA from -ca, a session cache so that a new connection resumes a session, and
// with -h2 HTTP/2 where the server offers it by ALPN. The protocol each
// target's connections negotiated, and how many were opened (TLS: full
// handshakes and resumptions), are printed with each phase. Targets named in
// -mesh-targets are in the Consul service mesh: routerload presents the
// Connect leaf of -mesh-service and checks the server's SPIFFE identity.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/router/openai"
)

type target struct {
	name   string
	urls   []string // rotated per request (direct: one URL per engine)
	client *http.Client
	conns  *connStats
}

// nameWidth is the width of the target column: 8, or the longest name.
var nameWidth = 8

type result struct {
	ttft, ttfe, total []time.Duration // first token, first event, end of stream
	errors            int
	firstErr          error
	late              int // requests sent >1ms after their scheduled time (generator saturated)
	completed         int
	elapsed           time.Duration
	cpu               map[string]time.Duration // -cpu-pids label → CPU time of its processes while the target was loaded
}

// probe is one -cpu-pids entry: a process (and its children) whose CPU
// time is taken while a target is loaded, reported under label ("router",
// or "router-mesh/sidecars" for other processes on that target's path).
type probe struct {
	label string
	pid   int
}

func main() {
	var (
		targetsF  = flag.String("targets", "", "name=url[|url...],... e.g. direct=http://a|http://b,router=http://r")
		model     = flag.String("model", "m", "model name")
		maxTokens = flag.Int("max-tokens", 8, "max_tokens per request")
		rate      = flag.Float64("rate", 1000, "latency phase: requests per second (open loop)")
		round     = flag.Duration("round", 2*time.Second, "length of one round per target")
		rounds    = flag.Int("rounds", 3, "rounds per target in each phase")
		conc      = flag.Int("concurrency", 64, "throughput phase: concurrent clients")
		phases    = flag.String("phases", "latency,throughput", "phases to run")
		baseline  = flag.String("baseline", "direct", "latency phase: target the others are compared with")
		peer      = flag.String("peer", "nginx", "throughput phase: target the router is compared with")
		jsonOut   = flag.String("json", "", "also write results as JSON to this file")
		cpuPids   = flag.String("cpu-pids", "", "name=pid,... : also report the CPU time per request of these processes (and their child processes) while their target was loaded, e.g. router=123,nginx=456; name target/label: another process on that target's path, e.g. router-mesh/sidecars=789")
		caFile    = flag.String("ca", "", "PEM file of the CA that https targets' certificates are checked against (default: the system's roots)")
		h2        = flag.Bool("h2", false, "HTTP/2 to https targets that offer it by ALPN (default: HTTP/1.1 with keep-alive)")
		warmRate  = flag.Float64("warmup-rate", 200, "requests per second of each target's 0.5 s warm-up (its connection pool grows to what that rate needs)")
		meshF     = flag.String("mesh-targets", "", "name=service,... : these https targets are in the Consul service mesh: routerload presents the Connect leaf of -mesh-service and accepts the server only as that service (SPIFFE ID, chain to the Connect roots), e.g. router-mesh=oasis-router,direct-sidecar=oasis-engine")
		meshAddr  = flag.String("mesh-consul", "", "with -mesh-targets: the Consul agent's HTTP address the leaf and roots come from (default $CONSUL_HTTP_ADDR)")
		meshSvc   = flag.String("mesh-service", "web", "with -mesh-targets: the mesh service routerload is (intentions must allow it)")
	)
	flag.Parse()
	tlsCfg, err := clientTLS(*caFile, *h2)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	pids, err := parseCPUPids(*cpuPids)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	meshSvcs, err := parseMeshTargets(*meshF)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	var mesh *meshClient
	if len(meshSvcs) > 0 {
		if mesh, err = newMeshClient(*meshAddr, *meshSvc); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		defer mesh.Close()
	}
	// run loads one target and adds the CPU its processes used meanwhile.
	run := func(t target, load func() *result) *result {
		ps := pids[t.name]
		if len(ps) == 0 {
			return load()
		}
		c0 := make([]time.Duration, len(ps))
		for i, p := range ps {
			c0[i] = cpuTime(p.pid)
		}
		r := load()
		r.cpu = map[string]time.Duration{}
		for i, p := range ps {
			r.cpu[p.label] = cpuTime(p.pid) - c0[i]
		}
		return r
	}
	var targets []target
	for _, t := range strings.Split(*targetsF, ",") {
		name, urls, ok := strings.Cut(t, "=")
		if !ok {
			fmt.Fprintln(os.Stderr, "bad -targets entry:", t)
			os.Exit(2)
		}
		t := target{name: name, urls: strings.Split(urls, "|"), conns: newConnStats()}
		if svc, ok := meshSvcs[name]; ok {
			t.client = newClient(mesh.clientTLS(svc, *h2), *h2, t.conns)
		} else {
			t.client = newClient(tlsCfg, *h2, t.conns)
		}
		targets = append(targets, t)
	}
	for _, t := range targets {
		nameWidth = max(nameWidth, len(t.name))
	}
	body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"Say hello to the benchmark."}],"max_tokens":%d,"stream":true}`, *model, *maxTokens)
	out := map[string]any{"rate": *rate, "round": round.String(), "rounds": *rounds, "concurrency": *conc, "max_tokens": *maxTokens}

	// Warm every target's connection pool (and TLS session cache). A target
	// that answers nothing is a set-up error, not a figure.
	for _, t := range targets {
		r := openLoop(t, body, *warmRate, 500*time.Millisecond)
		if r.errors > 0 {
			fmt.Fprintf(os.Stderr, "warm-up: %s: %d of %d requests failed, first: %v\n", t.name, r.errors, r.errors+r.completed, r.firstErr)
		}
		if r.completed == 0 {
			os.Exit(1)
		}
	}
	protos := map[string]any{}
	for _, t := range targets {
		protos[t.name] = t.conns.protocol()
	}
	out["protocol"] = protos

	if strings.Contains(*phases, "latency") {
		res := map[string]*result{}
		c0 := snapshot(targets)
		for r := 0; r < *rounds; r++ {
			for _, t := range targets {
				got := run(t, func() *result { return openLoop(t, body, *rate, *round) })
				res[t.name] = merge(res[t.name], got)
			}
		}
		fmt.Printf("latency phase: %.0f streaming req/s open loop, %d rounds × %s per target, max_tokens=%d; %s\n", *rate, *rounds, *round, *maxTokens, protocolLine(targets))
		fmt.Printf("%-*s %8s %6s %6s %10s %10s %10s %10s %10s %10s\n", nameWidth, "target", "requests", "errors", "late", "ttft_p50", "ttft_p90", "ttft_p99", "total_p50", "total_p90", "total_p99")
		lat := map[string]any{}
		for _, t := range targets {
			r := res[t.name]
			fmt.Printf("%-*s %8d %6d %6d %10s %10s %10s %10s %10s %10s\n", nameWidth, t.name, len(r.ttft), r.errors, r.late,
				us(pct(r.ttft, 50)), us(pct(r.ttft, 90)), us(pct(r.ttft, 99)), us(pct(r.total, 50)), us(pct(r.total, 90)), us(pct(r.total, 99)))
			lat[t.name] = map[string]any{"requests": len(r.ttft), "errors": r.errors, "late": r.late,
				"ttft_us": pcts(r.ttft), "ttfe_us": pcts(r.ttfe), "total_us": pcts(r.total)}
		}
		if b, ok := res[*baseline]; ok {
			for _, t := range targets {
				if t.name == *baseline {
					continue
				}
				r := res[t.name]
				fmt.Printf("added latency %s − %s: ttft p50 %s p90 %s p99 %s | total p50 %s p90 %s p99 %s\n", t.name, *baseline,
					us(pct(r.ttft, 50)-pct(b.ttft, 50)), us(pct(r.ttft, 90)-pct(b.ttft, 90)), us(pct(r.ttft, 99)-pct(b.ttft, 99)),
					us(pct(r.total, 50)-pct(b.total, 50)), us(pct(r.total, 90)-pct(b.total, 90)), us(pct(r.total, 99)-pct(b.total, 99)))
			}
			// The goal, checked against this run: added time to first
			// event p50 ≤ 0.3 ms and p99 ≤ 1 ms, with the peer's in the same run.
			if r, ok := res["router"]; ok {
				a50, a99 := pct(r.ttft, 50)-pct(b.ttft, 50), pct(r.ttft, 99)-pct(b.ttft, 99)
				verdict := func(d, goal time.Duration) string {
					switch {
					case d < 0:
						return "inconclusive: the baseline was slower, noise exceeds the difference"
					case d <= goal:
						return "met"
					}
					return "NOT met"
				}
				fmt.Printf("summary: router adds ttft p50 %s (goal ≤ 300µs: %s), p99 %s (goal ≤ 1000µs: %s)", us(a50),
					verdict(a50, 300*time.Microsecond), us(a99), verdict(a99, time.Millisecond))
				if p, ok := res[*peer]; ok {
					fmt.Printf("; %s adds p50 %s, p99 %s", *peer, us(pct(p.ttft, 50)-pct(b.ttft, 50)), us(pct(p.ttft, 99)-pct(b.ttft, 99)))
				}
				fmt.Println()
			}
		}
		// The mesh issue's goal: the router in the mesh adds ≤ 0.5 ms of
		// TTFT p50 over the plain router in the same run.
		if m, ok := res["router-mesh"]; ok {
			if r, ok := res["router"]; ok {
				a50, a99 := pct(m.ttft, 50)-pct(r.ttft, 50), pct(m.ttft, 99)-pct(r.ttft, 99)
				verdict := "met"
				switch {
				case a50 < 0:
					verdict = "inconclusive: the plain router was slower, noise exceeds the difference"
				case a50 > 500*time.Microsecond:
					verdict = "NOT met"
				}
				fmt.Printf("summary: router-mesh adds over router ttft p50 %s (goal ≤ 500µs: %s), p99 %s\n", us(a50), verdict, us(a99))
			}
		}
		fe := make([]string, len(targets))
		for i, t := range targets {
			fe[i] = fmt.Sprintf("%s %s/%s", t.name, us(pct(res[t.name].ttfe, 50)), us(pct(res[t.name].ttfe, 99)))
		}
		fmt.Printf("first event (the role-only chunk where forwarded at once) p50/p99: %s\n", strings.Join(fe, ", "))
		fmt.Println(connLine(targets, c0))
		printCPU(res, targets, pids, *peer)
		out["latency"] = lat
	}

	if strings.Contains(*phases, "throughput") {
		res := map[string]*result{}
		perRound := map[string][]float64{} // req/s of each round, for paired ratios
		c0 := snapshot(targets)
		for r := 0; r < *rounds; r++ {
			for _, t := range targets {
				got := run(t, func() *result { return closedLoop(t, body, *conc, *round) })
				perRound[t.name] = append(perRound[t.name], float64(got.completed)/got.elapsed.Seconds())
				res[t.name] = merge(res[t.name], got)
			}
		}
		fmt.Printf("throughput phase: %d concurrent streaming clients, %d rounds × %s per target; %s\n", *conc, *rounds, *round, protocolLine(targets))
		tp := map[string]any{}
		rps := map[string]float64{}
		for _, t := range targets {
			r := res[t.name]
			rps[t.name] = float64(r.completed) / r.elapsed.Seconds()
			fmt.Printf("%-*s %10.0f req/s  (%d completed, %d errors, p50 %s p99 %s)\n", nameWidth, t.name, rps[t.name], r.completed, r.errors, us(pct(r.total, 50)), us(pct(r.total, 99)))
			tp[t.name] = map[string]any{"req_per_s": rps[t.name], "completed": r.completed, "errors": r.errors, "total_us": pcts(r.total)}
		}
		// The goal with real-time engines: the router keeps ≥ 0.99×
		// the throughput of calling the engines directly.
		if b := rps[*baseline]; b > 0 && rps["router"] > 0 {
			verdict := "met"
			if rps["router"] < 0.99*b {
				verdict = "NOT met"
			}
			fmt.Printf("throughput ratio router/%s: %.3f (goal ≥ 0.990: %s)", *baseline, rps["router"]/b, verdict)
			if p, ok := rps[*peer]; ok {
				fmt.Printf("; %s/%s: %.3f", *peer, *baseline, p/b)
			}
			fmt.Println()
			out["router_over_baseline"] = rps["router"] / b
		}
		if p, ok := rps[*peer]; ok && p > 0 {
			verdict := "met"
			if rps["router"] < p {
				verdict = "NOT met"
			}
			fmt.Printf("throughput ratio router/%s: %.3f (goal ≥ 1.000: %s)\n", *peer, rps["router"]/p, verdict)
			out["router_over_peer"] = rps["router"] / p
			if rs := pairedRatios(perRound["router"], perRound[*peer]); len(rs) > 1 {
				fmt.Printf("per-round ratios router/%s: %s\n", *peer, describeRatios(rs))
				out["router_over_peer_rounds"] = rs
			}
		}
		fmt.Println(connLine(targets, c0))
		printCPU(res, targets, pids, *peer)
		out["throughput"] = tp
	}
	if *jsonOut != "" {
		b, _ := json.MarshalIndent(out, "", "  ")
		_ = os.WriteFile(*jsonOut, b, 0o644)
	}
}

// timing is one streamed request's: first event, first token, end.
type timing struct{ ttfe, ttft, total time.Duration }

// stream sends one streaming request and reads it to the end.
func stream(client *http.Client, url, body string) (tm timing, err error) {
	start := time.Now()
	resp, err := client.Post(url+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		return tm, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		_, _ = io.Copy(io.Discard, resp.Body)
		return tm, fmt.Errorf("status %d", resp.StatusCode)
	}
	br := bufio.NewReaderSize(resp.Body, 16<<10)
	done := false
	for {
		line, err := br.ReadSlice('\n')
		if data, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			if tm.ttfe == 0 {
				tm.ttfe = time.Since(start)
			}
			if tm.ttft == 0 && !openai.IsPreamble(data) { // the router's own rule for its hold
				tm.ttft = time.Since(start)
			}
			if bytes.Equal(bytes.TrimSpace(data), []byte("[DONE]")) {
				done = true
			}
		}
		if err == io.EOF {
			break
		}
		if err != nil && err != bufio.ErrBufferFull {
			return tm, err
		}
	}
	if !done {
		return tm, fmt.Errorf("stream ended without [DONE]")
	}
	tm.total = time.Since(start)
	return tm, nil
}

func openLoop(t target, body string, rate float64, d time.Duration) *result {
	n := int(rate * d.Seconds())
	interval := time.Duration(float64(time.Second) / rate)
	res := &result{ttft: make([]time.Duration, 0, n), ttfe: make([]time.Duration, 0, n), total: make([]time.Duration, 0, n)}
	var mu sync.Mutex
	var wg sync.WaitGroup
	start := time.Now()
	for i := 0; i < n; i++ {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		}
		late := time.Since(at) > time.Millisecond
		url := t.urls[i%len(t.urls)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			tm, err := stream(t.client, url, body)
			mu.Lock()
			defer mu.Unlock()
			if late {
				res.late++
			}
			if err != nil {
				res.errors++
				if res.firstErr == nil {
					res.firstErr = fmt.Errorf("%s: %w", url, err)
				}
				return
			}
			res.ttft = append(res.ttft, tm.ttft)
			res.ttfe = append(res.ttfe, tm.ttfe)
			res.total = append(res.total, tm.total)
			res.completed++
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

func closedLoop(t target, body string, conc int, d time.Duration) *result {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res := &result{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	var seq atomic.Int64
	start := time.Now()
	for c := 0; c < conc; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				url := t.urls[int(seq.Add(1))%len(t.urls)]
				tm, err := stream(t.client, url, body)
				mu.Lock()
				if err != nil {
					res.errors++
					if res.firstErr == nil {
						res.firstErr = fmt.Errorf("%s: %w", url, err)
					}
				} else if ctx.Err() == nil {
					res.completed++
					res.total = append(res.total, tm.total)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.elapsed = d
	_ = start
	return res
}

// pairedRatios divides each round's req/s by the peer's in the same round:
// adjacent rounds see nearly the same machine load, so the spread of these
// ratios says how much of a whole-run ratio is noise.
func pairedRatios(a, b []float64) []float64 {
	var rs []float64
	for i := range min(len(a), len(b)) {
		if b[i] > 0 {
			rs = append(rs, a[i]/b[i])
		}
	}
	return rs
}

func describeRatios(rs []float64) string {
	s := slices.Clone(rs)
	slices.Sort(s)
	above := 0
	for _, r := range s {
		if r >= 1 {
			above++
		}
	}
	med := s[len(s)/2]
	if len(s)%2 == 0 {
		med = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return fmt.Sprintf("median %.3f, min %.3f, max %.3f, %d of %d rounds ≥ 1", med, s[0], s[len(s)-1], above, len(s))
}

func merge(a, b *result) *result {
	if a == nil {
		return b
	}
	a.ttft = append(a.ttft, b.ttft...)
	a.ttfe = append(a.ttfe, b.ttfe...)
	a.total = append(a.total, b.total...)
	a.errors += b.errors
	if a.firstErr == nil {
		a.firstErr = b.firstErr
	}
	a.late += b.late
	a.completed += b.completed
	a.elapsed += b.elapsed
	for l, d := range b.cpu {
		if a.cpu == nil {
			a.cpu = map[string]time.Duration{}
		}
		a.cpu[l] += d
	}
	return a
}

func pct(v []time.Duration, p float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(float64(len(s)-1) * p / 100)
	return s[i]
}

func pcts(v []time.Duration) map[string]float64 {
	return map[string]float64{"p50": float64(pct(v, 50).Microseconds()), "p90": float64(pct(v, 90).Microseconds()), "p99": float64(pct(v, 99).Microseconds())}
}

func us(d time.Duration) string { return fmt.Sprintf("%.0fµs", float64(d.Nanoseconds())/1e3) }

// printCPU prints CPU time per completed request for the targets with a pid:
// less sensitive to other load on the machine than req/s, which is what a
// shared benchmark machine needs.
func printCPU(res map[string]*result, targets []target, pids map[string][]probe, peer string) {
	if len(pids) == 0 {
		return
	}
	per := map[string]float64{}
	w := nameWidth
	for _, ps := range pids {
		for _, p := range ps {
			w = max(w, len(p.label))
		}
	}
	for _, t := range targets {
		r := res[t.name]
		if r == nil || r.completed == 0 {
			continue
		}
		for _, p := range pids[t.name] {
			c := r.cpu[p.label]
			per[p.label] = float64(c.Microseconds()) / float64(r.completed)
			fmt.Printf("cpu %-*s %6.1f µs per request (%s CPU for %d requests)\n", w, p.label, per[p.label], c.Round(time.Millisecond), r.completed)
		}
	}
	if p := per[peer]; p > 0 && per["router"] > 0 {
		fmt.Printf("cpu ratio router/%s: %.2f\n", peer, per["router"]/p)
	}
}

// parseCPUPids reads -cpu-pids: target[/label]=pid,... → the probes taken
// while each target is loaded, in the order given.
func parseCPUPids(s string) (map[string][]probe, error) {
	pids := map[string][]probe{}
	if s == "" {
		return pids, nil
	}
	for _, e := range strings.Split(s, ",") {
		label, pid, ok := strings.Cut(e, "=")
		n, err := strconv.Atoi(pid)
		if !ok || err != nil || n <= 0 || label == "" {
			return nil, fmt.Errorf("bad -cpu-pids entry: %s", e)
		}
		target, _, _ := strings.Cut(label, "/")
		pids[target] = append(pids[target], probe{label: label, pid: n})
	}
	return pids, nil
}

// cpuTime is the user+system CPU time of pid and its direct children (nginx
// workers), from /proc. Linux reports it in USER_HZ ticks, 100 per second.
func cpuTime(pid int) time.Duration {
	total := procTicks(pid)
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, f := range stats {
		if ppid, ok := statField(f, 4); ok && ppid == int64(pid) {
			c, _ := strconv.Atoi(filepath.Base(filepath.Dir(f)))
			total += procTicks(c)
		}
	}
	return time.Duration(total) * 10 * time.Millisecond
}

func procTicks(pid int) int64 {
	f := fmt.Sprintf("/proc/%d/stat", pid)
	u, ok1 := statField(f, 14)
	s, ok2 := statField(f, 15)
	if !ok1 || !ok2 {
		return 0
	}
	return u + s
}

// statField returns field n (1-based, as in proc(5)) of a /proc stat file.
func statField(path string, n int) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	i := bytes.LastIndexByte(b, ')') // the command name may contain spaces
	if i < 0 {
		return 0, false
	}
	fields := strings.Fields(string(b[i+1:])) // fields 3...
	if n-3 < 0 || n-3 >= len(fields) {
		return 0, false
	}
	v, err := strconv.ParseInt(fields[n-3], 10, 64)
	return v, err == nil
}
