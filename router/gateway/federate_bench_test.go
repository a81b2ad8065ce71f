package gateway

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkFederatedHop measures what a hop to another datacenter's router
// adds to a streamed request, on loopback: the same engine answers through
// its own datacenter's gateway (local), or through a gateway without a
// local worker that forwards to it over HTTP/3 (h3) or HTTP/2 with TLS
// (h2), mutual TLS both. It reports per request the latency p50 and p99 and
// the CPU time of the whole process (both gateways, the engine and the
// client); the hop's cost is a variant's figure less local's.
func BenchmarkFederatedHop(b *testing.B) {
	for _, v := range []struct {
		name string
		h2   bool
		hop  bool
	}{{"local", false, false}, {"h3", false, true}, {"h2", true, true}} {
		b.Run(v.name, func(b *testing.B) {
			e := sseEngine()
			defer e.Close()
			dc1, dc2 := fedPairOver(b, v.h2, nil, map[string]string{"x": "other@" + deadAddr(b)},
				map[string]string{"b": "m@" + addr(e)})
			target := dc2
			if v.hop {
				target = dc1
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
			defer client.CloseIdleConnections()
			post := func() {
				resp, err := client.Post(target.h.srv.URL+"/v1/chat/completions", "application/json",
					strings.NewReader(streamBody))
				if err != nil {
					b.Fatal(err)
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				_ = resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			for range 50 {
				post() // connections up, the prefill and TTFT windows warm
			}
			lat := make([]time.Duration, 0, b.N)
			cpu0 := cpuTime()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				post()
				lat = append(lat, time.Since(t0))
			}
			b.StopTimer()
			cpu := cpuTime() - cpu0
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "cpu-µs/req")
			if v.hop && forwardedCount(b, dc1) < b.N {
				b.Fatalf("only %d of %d requests were forwarded", forwardedCount(b, dc1), b.N)
			}
		})
	}
}

// cpuTime is the process's user and system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
