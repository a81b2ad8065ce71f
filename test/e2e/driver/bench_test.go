package driver

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/shoenig/test/must"
)

// BenchmarkStartTaskToReady measures, on the real agent, the driver's
// StartTask → engine ready time (the "Engine ready" event's ready_after_ms,
// taken from StartTask's entry) against the engine's own start-up: the
// same oasis-sim command started directly and polled every millisecond.
// It reports their difference (the driver's overhead) and the RSS of the
// driver plugin process and of one engine supervisor.
//
//	go test ./test/e2e/driver -run '^$' -bench StartTaskToReady -benchtime 10x
func BenchmarkStartTaskToReady(b *testing.B) {
	var driverMs, directMs, launchedMs float64
	var overheads []float64
	for i := 0; b.Loop(); i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		jobID := fmt.Sprintf("oasis-driver-bench-%d", i)
		_, err := stack.RunJobHCL(ctx, simJob(jobID, ""))
		must.NoError(b, err)
		allocs, err := stack.WaitAllocsRunning(ctx, jobID)
		must.NoError(b, err)
		ev := waitEvent(b, allocs[0].ID, "Engine ready after")
		ms, err := strconv.ParseFloat(ev.Details["ready_after_ms"], 64)
		must.NoError(b, err)
		driverMs += ms
		lms, err := strconv.ParseFloat(ev.Details["launched_ms"], 64)
		must.NoError(b, err)
		launchedMs += lms
		if i == 0 {
			rss := pluginRSS(b)
			b.ReportMetric(rss["plugin"], "plugin-RSS-MiB")
			b.ReportMetric(rss["supervisor"], "supervisor-RSS-MiB")
		}
		must.NoError(b, stack.StopJob(ctx, jobID))
		direct := directStartup(b)
		directMs += direct
		overheads = append(overheads, ms-direct)
		cancel()
	}
	n := float64(b.N)
	b.ReportMetric(driverMs/n, "start-to-ready-ms")
	b.ReportMetric(directMs/n, "engine-startup-ms")
	b.ReportMetric((driverMs-launchedMs)/n, "start-to-launched-ms")
	b.ReportMetric((driverMs-directMs)/n, "overhead-ms")
	slices.Sort(overheads)
	b.ReportMetric(overheads[len(overheads)/2], "overhead-p50-ms")
	b.ReportMetric(overheads[(len(overheads)*9)/10], "overhead-p90-ms")
}

// directStartup starts oasis-sim with the argv the driver renders and
// returns the milliseconds until /health answers 200.
func directStartup(b testing.TB) float64 {
	ports, err := testutil.FreePorts(2)
	must.NoError(b, err)
	events := fmt.Sprintf(`{"enable_kv_cache_events":true,"publisher":"zmq","endpoint":"tcp://127.0.0.1:%d","topic":"kv-events"}`, ports[1])
	cmd := exec.Command(stack.Bin("oasis-sim"), "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "127.0.0.1",
		"--port", strconv.Itoa(ports[0]), "--served-model-name", "llama", "--tensor-parallel-size", "1",
		"--block-size", "16", "--kv-events-config", events)
	start := time.Now()
	must.NoError(b, cmd.Start())
	defer func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	client := &http.Client{Timeout: time.Second}
	url := fmt.Sprintf("http://127.0.0.1:%d/health", ports[0])
	for time.Since(start) < 30*time.Second {
		if resp, err := client.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return float64(time.Since(start).Microseconds()) / 1e3
			}
		}
		time.Sleep(time.Millisecond) // the measurement's resolution: this is what the benchmark times
	}
	b.Fatal("oasis-sim did not become healthy")
	return 0
}

// pluginRSS reads VmRSS (MiB) of the nomad-driver-llm plugin process and
// of one of its engine supervisors (the same binary, started with
// arguments: the plugin itself has none).
func pluginRSS(b testing.TB) map[string]float64 {
	out := map[string]float64{}
	plugin := filepath.Join(stack.PluginDir, "nomad-driver-llm")
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || exe != plugin {
			continue
		}
		cmdline, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		kind := "plugin"
		if args := strings.Split(strings.TrimRight(string(cmdline), "\x00"), "\x00"); len(args) > 1 {
			kind = "supervisor"
		}
		status, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				out[kind] = max(out[kind], kb/1024)
			}
		}
	}
	must.MapContainsKey(b, out, "plugin", must.Sprint("no nomad-driver-llm process found"))
	return out
}
