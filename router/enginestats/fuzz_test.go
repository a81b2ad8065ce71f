package enginestats

import (
	"bytes"
	"math"
	"testing"
)

// FuzzParseEngineMetrics feeds arbitrary Prometheus text (an engine's /metrics
// page: whatever a worker, or anything listening at its address, serves) to
// ParseEngineMetrics. Beyond never panicking:
//   - every value is finite and ≥ 0 (NaN and ±Inf series are skipped and
//     negative sums read 0: either would poison the load and power terms of
//     every score);
//   - a signal that is absent reads 0;
//   - an unrelated family appended to an accepted page changes nothing, so the
//     result depends only on the names the router knows.
func FuzzParseEngineMetrics(f *testing.F) {
	for _, s := range []string{
		"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} 3\n" +
			"vllm:num_requests_waiting{model_name=\"m\"} 2\nvllm:kv_cache_usage_perc 0.25\n" +
			"# TYPE vllm:generation_tokens_total counter\nvllm:generation_tokens_total 1000\noasis_sim_power_watts 215.5\n",
		"sglang:num_running_reqs{tp_rank=\"0\"} 1\nsglang:num_running_reqs{tp_rank=\"1\"} 1\nsglang:num_queue_reqs 4\n",
		"llamacpp:requests_processing 1\nllamacpp:tokens_predicted_total 77\n",
		"# TYPE trtllm_num_requests_running gauge\ntrtllm_num_requests_running{engine_type=\"trtllm\"} 6.0\n",
		"# TYPE trtllm_e2e_request_latency_seconds histogram\ntrtllm_e2e_request_latency_seconds_bucket{le=\"+Inf\"} 3.0\n",
		"vllm:num_requests_running NaN\nsglang:num_running_reqs 2\n",
		"vllm:num_requests_running +Inf\nvllm:num_requests_running{a=\"b\"} -Inf\n",
		"vllm:num_requests_running 1e308\nvllm:num_requests_running{a=\"b\"} 1e308\n",
		"vllm:num_requests_running 1 1700000000000\n",
		"vllm:num_requests_running -5\nvllm:num_requests_waiting -1e9\n",
		"bad metric line {",
	} {
		f.Add([]byte(s))
	}
	power := DefaultPowerMetrics()
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := ParseEngineMetrics(bytes.NewReader(data), power)
		if err != nil {
			if m != (EngineMetrics{}) {
				t.Fatalf("error %v with metrics %+v", err, m)
			}
			return
		}
		for name, v := range map[string]float64{"running": m.Running, "waiting": m.Waiting,
			"kv usage": m.KVUsage, "generated tokens": m.GenTokens, "power": m.PowerWatts} {
			if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
				t.Fatalf("%s = %v", name, v)
			}
		}
		if !m.HasLoad && (m.Running != 0 || m.Waiting != 0) {
			t.Fatalf("no load signal but running %v, waiting %v", m.Running, m.Waiting)
		}
		if !m.HasGenTokens && m.GenTokens != 0 || !m.HasPower && m.PowerWatts != 0 {
			t.Fatalf("absent signal reads non-zero: %+v", m)
		}
		more := append(bytes.Clone(data), "\n# TYPE oasis_fuzz_unrelated gauge\noasis_fuzz_unrelated 1\n"...)
		if bytes.Contains(data, []byte("oasis_fuzz_unrelated")) {
			return
		}
		m2, err := ParseEngineMetrics(bytes.NewReader(more), power)
		if err != nil {
			// The appended line may complete a broken last line into an
			// invalid one; only a page that still parses is comparable.
			return
		}
		if m2 != m {
			t.Fatalf("an unrelated family changed the result: %+v → %+v", m, m2)
		}
	})
}
