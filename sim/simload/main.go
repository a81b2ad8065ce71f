// Command simload is oasis-sim's load generator: closed-loop streaming completions
// against one oasis-sim (started by simload itself with -sim, or already running at
// -url), reporting requests/s, latency percentiles and the server's RSS.
//
//	go build -o bin/oasis-sim ./cmd/oasis-sim && go run ./sim/simload -sim bin/oasis-sim -c 64 -d 10s
//	go run ./sim/simload -sim bin/oasis-sim -fill-blocks 100000   # RSS with 100k cached blocks
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oasis-llm/oasis/internal/tokenizer"
)

func main() {
	var (
		simPath    = flag.String("sim", "", "oasis-sim binary to start (at --speed 0 on a free loopback port)")
		simArgs    = flag.String("sim-args", "", "extra oasis-sim flags, space separated")
		url        = flag.String("url", "", "base URL of a running oasis-sim (instead of -sim)")
		conc       = flag.Int("c", 64, "concurrent streams")
		dur        = flag.Duration("d", 10*time.Second, "measurement duration")
		warmup     = flag.Duration("warmup", 2*time.Second, "warm-up before measuring")
		promptLen  = flag.Int("prompt", 128, "prompt tokens")
		outLen     = flag.Int("out", 16, "output tokens")
		fillBlocks = flag.Int("fill-blocks", 0, "instead of load: fill the prefix cache with this many blocks and report RSS")
	)
	flag.Parse()
	if err := run(*simPath, *simArgs, *url, *conc, *dur, *warmup, *promptLen, *outLen, *fillBlocks); err != nil {
		fmt.Fprintln(os.Stderr, "simload:", err)
		os.Exit(1)
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func run(simPath, simArgs, url string, conc int, dur, warmup time.Duration, promptLen, outLen, fill int) error {
	var proc *os.Process
	if simPath != "" {
		port, err := freePort()
		if err != nil {
			return err
		}
		args := []string{"serve", "sim-model", "--port", strconv.Itoa(port), "--speed", "0", "--log-level", "warn"}
		if fill > 0 {
			args = append(args, "--num-gpu-blocks", strconv.Itoa(fill+fill/10), "--max-model-len", "4096")
		}
		args = append(args, strings.Fields(simArgs)...)
		cmd := exec.Command(simPath, args...)
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("starting oasis-sim: %w", err)
		}
		proc = cmd.Process
		defer func() { _ = proc.Kill(); _, _ = proc.Wait() }()
		url = fmt.Sprintf("http://127.0.0.1:%d", port)
		if err := waitHealthy(url, 10*time.Second); err != nil {
			return err
		}
		fmt.Printf("oasis-sim pid %d at %s: %s\n", proc.Pid, url, strings.Join(args, " "))
	}
	if url == "" {
		return errors.New("give -sim or -url")
	}
	tr := &http.Transport{MaxIdleConns: conc * 2, MaxIdleConnsPerHost: conc * 2, DisableCompression: true}
	client := &http.Client{Transport: tr}
	if fill > 0 {
		return fillCache(client, url, fill, proc)
	}

	var (
		count    atomic.Int64
		errs     atomic.Int64
		mu       sync.Mutex
		lats     []time.Duration
		ttfts    []time.Duration
		measure  atomic.Bool
		stopping atomic.Bool
		wg       sync.WaitGroup
	)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 99))
			var localL, localT []time.Duration
			for !stopping.Load() {
				prompt := textPrompt(rng, promptLen)
				body, _ := json.Marshal(map[string]any{"model": "sim-model", "prompt": prompt, "max_tokens": outLen, "stream": true})
				start := time.Now()
				ttft, n, err := stream(client, url, body)
				lat := time.Since(start)
				if !measure.Load() {
					continue
				}
				if err != nil || n != outLen {
					errs.Add(1)
					continue
				}
				count.Add(1)
				localL = append(localL, lat)
				localT = append(localT, ttft)
			}
			mu.Lock()
			lats = append(lats, localL...)
			ttfts = append(ttfts, localT...)
			mu.Unlock()
		}()
	}
	time.Sleep(warmup)
	cpu0 := procCPU(proc)
	self0 := selfCPU()
	measure.Store(true)
	t0 := time.Now()
	time.Sleep(dur)
	measure.Store(false)
	elapsed := time.Since(t0)
	cpu1 := procCPU(proc)
	self1 := selfCPU()
	stopping.Store(true)
	wg.Wait()
	n := count.Load()
	fmt.Printf("streams=%d prompt=%d out=%d duration=%v\n", conc, promptLen, outLen, elapsed.Round(time.Millisecond))
	fmt.Printf("completed=%d errors=%d rate=%.0f req/s (%.0f SSE token events/s)\n", n, errs.Load(), float64(n)/elapsed.Seconds(), float64(n*int64(outLen))/elapsed.Seconds())
	fmt.Printf("latency p50=%v p99=%v  ttft p50=%v p99=%v\n", pct(lats, 50), pct(lats, 99), pct(ttfts, 50), pct(ttfts, 99))
	if proc != nil {
		fmt.Printf("oasis-sim CPU %.2f cores, simload CPU %.2f cores; oasis-sim %s\n",
			(cpu1-cpu0)/elapsed.Seconds(), (self1-self0)/elapsed.Seconds(), rss(proc.Pid))
	}
	return nil
}

var promptWords = strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu")

// textPrompt returns random text that oasis-sim tokenizes to exactly n prompt tokens
// (BOS included), as a client sending text would.
func textPrompt(rng *rand.Rand, n int) string {
	var b strings.Builder
	for {
		b.WriteString(promptWords[rng.IntN(len(promptWords))])
		b.WriteString(" ")
		b.WriteString(strconv.Itoa(rng.IntN(1000)))
		b.WriteString(" ")
		if ids := tokenizer.EncodePrompt(b.String()); len(ids) >= n {
			text := tokenizer.Decode(ids[1:n], false)
			if len(tokenizer.EncodePrompt(text)) != n {
				panic("prompt length drifted")
			}
			return text
		}
	}
}

// stream posts one streaming request and returns time to first token and token events.
func stream(client *http.Client, url string, body []byte) (time.Duration, int, error) {
	start := time.Now()
	resp, err := client.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return 0, 0, fmt.Errorf("status %d: %s", resp.StatusCode, b)
	}
	br := bufio.NewReaderSize(resp.Body, 16384)
	var ttft time.Duration
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return ttft, n, fmt.Errorf("stream ended without [DONE]: %w", err)
		}
		if !bytes.HasPrefix(line, []byte("data: ")) {
			continue
		}
		if bytes.HasPrefix(line, []byte("data: [DONE]")) {
			return ttft, n, nil
		}
		if n == 0 {
			ttft = time.Since(start)
		}
		n++
	}
}

func waitHealthy(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s not healthy after %v", url, timeout)
}

func fillCache(client *http.Client, url string, blocks int, proc *os.Process) error {
	ctx := context.Background()
	const promptLen = 2048 // 128 blocks of 16
	rng := rand.New(rand.NewPCG(1, 2))
	start := time.Now()
	sent := 0
	for cached := 0; cached < blocks; {
		var wg sync.WaitGroup
		for range 8 {
			prompt := make([]int32, promptLen+1)
			for i := range prompt {
				prompt[i] = int32(rng.IntN(16_000_000))
			}
			body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 1})
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/completions", bytes.NewReader(body))
				if resp, err := client.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}()
			sent++
		}
		wg.Wait()
		v, err := metric(client, url, "oasis_sim_cached_blocks")
		if err != nil {
			return err
		}
		cached = int(v)
	}
	v, _ := metric(client, url, "oasis_sim_cached_blocks")
	fmt.Printf("cached blocks=%.0f after %d requests of %d tokens in %v\n", v, sent, promptLen+1, time.Since(start).Round(time.Millisecond))
	if proc != nil {
		fmt.Printf("oasis-sim %s\n", rss(proc.Pid))
	}
	return nil
}

func metric(client *http.Client, url, name string) (float64, error) {
	resp, err := client.Get(url + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			return strconv.ParseFloat(f[len(f)-1], 64)
		}
	}
	return 0, fmt.Errorf("metric %s not found", name)
}

func rss(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "RSS unknown"
	}
	var parts []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "VmRSS:") || strings.HasPrefix(l, "VmHWM:") {
			parts = append(parts, strings.Join(strings.Fields(l), " "))
		}
	}
	return strings.Join(parts, ", ")
}

// procCPU is user+system CPU seconds of a process (Linux /proc).
func procCPU(p *os.Process) float64 {
	if p == nil {
		return 0
	}
	return statCPU(fmt.Sprintf("/proc/%d/stat", p.Pid))
}

func selfCPU() float64 { return statCPU("/proc/self/stat") }

func statCPU(path string) float64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (ut + st) / 100 // USER_HZ
}

func pct(d []time.Duration, p int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, len(d)*p/100)].Round(10 * time.Microsecond)
}
