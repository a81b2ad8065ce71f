package enginestats

import (
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/shoenig/test/must"
)

func TestParseEngineMetrics(t *testing.T) {
	cases := []struct {
		name string
		text string
		want EngineMetrics
	}{
		{"vllm", `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{model_name="m"} 2
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{model_name="m"} 1000
# TYPE oasis_sim_power_watts gauge
oasis_sim_power_watts 215.5
`, EngineMetrics{Running: 3, Waiting: 2, KVUsage: 0.25, HasLoad: true, GenTokens: 1000, HasGenTokens: true, PowerWatts: 215.5, HasPower: true}},
		{"sglang", `sglang:num_running_reqs{tp_rank="0"} 1
sglang:num_running_reqs{tp_rank="1"} 1
sglang:num_queue_reqs 4
sglang:token_usage 0.5
`, EngineMetrics{Running: 2, Waiting: 4, KVUsage: 0.5, HasLoad: true}},
		{"llama.cpp", `llamacpp:requests_processing 1
llamacpp:requests_deferred 0
llamacpp:tokens_predicted_total 77
`, EngineMetrics{Running: 1, HasLoad: true, GenTokens: 77, HasGenTokens: true}},
		// As trtllm-serve's /prometheus/metrics writes it (Python
		// prometheus_client: float values, _created series, labels from
		// the server's model_name/engine_type).
		{"trtllm", `# HELP trtllm_request_success_total Count of successfully processed requests.
# TYPE trtllm_request_success_total counter
trtllm_request_success_total{engine_type="trtllm",finished_reason="stop",model_name="llama-3-8b"} 41.0
# HELP trtllm_request_success_created Count of successfully processed requests.
# TYPE trtllm_request_success_created gauge
trtllm_request_success_created{engine_type="trtllm",finished_reason="stop",model_name="llama-3-8b"} 1.7636e+09
# HELP trtllm_generation_tokens_total Cumulative number of generation (output) tokens produced.
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{engine_type="trtllm",model_name="llama-3-8b"} 5248.0
# HELP trtllm_kv_cache_hit_rate KV cache hit rate
# TYPE trtllm_kv_cache_hit_rate gauge
trtllm_kv_cache_hit_rate{engine_type="trtllm",model_name="llama-3-8b"} 0.62
# HELP trtllm_kv_cache_utilization KV cache utilization
# TYPE trtllm_kv_cache_utilization gauge
trtllm_kv_cache_utilization{engine_type="trtllm",model_name="llama-3-8b"} 0.375
# HELP trtllm_num_requests_running Number of active requests
# TYPE trtllm_num_requests_running gauge
trtllm_num_requests_running{engine_type="trtllm",model_name="llama-3-8b"} 6.0
# HELP trtllm_num_requests_waiting Number of queued requests
# TYPE trtllm_num_requests_waiting gauge
trtllm_num_requests_waiting{engine_type="trtllm",model_name="llama-3-8b"} 2.0
# HELP trtllm_kv_cache_used_blocks Number of used KV cache blocks
# TYPE trtllm_kv_cache_used_blocks gauge
trtllm_kv_cache_used_blocks{engine_type="trtllm",model_name="llama-3-8b"} 768.0
`, EngineMetrics{Running: 6, Waiting: 2, KVUsage: 0.375, HasLoad: true, GenTokens: 5248, HasGenTokens: true}},
		// Without enable_iter_perf_stats trtllm-serve publishes only
		// per-request series: no load signal, the router's own in-flight
		// counts stay the load term's input.
		{"trtllm without iteration stats", `# TYPE trtllm_e2e_request_latency_seconds histogram
trtllm_e2e_request_latency_seconds_bucket{engine_type="trtllm",le="0.3",model_name="m"} 0.0
trtllm_e2e_request_latency_seconds_bucket{engine_type="trtllm",le="+Inf",model_name="m"} 3.0
trtllm_e2e_request_latency_seconds_count{engine_type="trtllm",model_name="m"} 3.0
trtllm_e2e_request_latency_seconds_sum{engine_type="trtllm",model_name="m"} 4.5
# TYPE trtllm_generation_tokens_total counter
trtllm_generation_tokens_total{engine_type="trtllm",model_name="m"} 96.0
`, EngineMetrics{GenTokens: 96, HasGenTokens: true}},
		{"nothing known", "other_metric 1\n", EngineMetrics{}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ParseEngineMetrics(strings.NewReader(tc.text), DefaultPowerMetrics())
			must.NoError(t, err)
			must.Eq(t, tc.want, got)
		})
	}
	_, err := ParseEngineMetrics(strings.NewReader("bad metric line {"), nil)
	must.Error(t, err)
}

func f(v float64) *float64 { return &v }
func i(v int64) *int64     { return &v }

func TestNodePowerWatts(t *testing.T) {
	dev := func(attrs map[string]*nomadapi.StatValue) *nomadapi.DeviceStats {
		return &nomadapi.DeviceStats{Stats: &nomadapi.StatObject{Attributes: attrs}}
	}
	cases := []struct {
		name  string
		hs    *nomadapi.HostStats
		watts float64
		ok    bool
	}{
		{"nil", nil, 0, false},
		{"two GPUs in W and mW, limit ignored", &nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{
			Vendor: "nvidia", Type: "gpu", Name: "A100",
			InstanceStats: map[string]*nomadapi.DeviceStats{
				"GPU-0": dev(map[string]*nomadapi.StatValue{"Power usage": {FloatNumeratorVal: f(250), Unit: "W"}, "Power limit": {IntNumeratorVal: i(400), Unit: "W"}}),
				"GPU-1": dev(map[string]*nomadapi.StatValue{"power_draw": {IntNumeratorVal: i(150500), Unit: "mW"}}),
			}}}}, 400.5, true},
		{"nomad-device-gpu names: draw wins over usage fraction, N/A skipped", &nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{InstanceStats: map[string]*nomadapi.DeviceStats{
			"GPU-0": dev(map[string]*nomadapi.StatValue{
				"Power draw":  {FloatNumeratorVal: f(212.5), Unit: "W"},
				"Power usage": {FloatNumeratorVal: f(212.5), FloatDenominatorVal: f(400), Unit: "W"},
				"Power limit": {FloatNumeratorVal: f(400), Unit: "W"},
				"Energy":      {FloatNumeratorVal: f(1e6), Unit: "J"}}),
			"GPU-1-mig": dev(map[string]*nomadapi.StatValue{"Power draw": {Unit: "W"}}), // N/A: no numerator
		}}}}, 212.5, true},
		{"nested", &nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{InstanceStats: map[string]*nomadapi.DeviceStats{
			"x": {Stats: &nomadapi.StatObject{Nested: map[string]*nomadapi.StatObject{"power": {Attributes: map[string]*nomadapi.StatValue{"Power": {FloatNumeratorVal: f(90), Unit: "W"}}}}}}}}}}, 90, true},
		{"no power stat", &nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{InstanceStats: map[string]*nomadapi.DeviceStats{
			"x": dev(map[string]*nomadapi.StatValue{"Memory": {IntNumeratorVal: i(1), Unit: "MiB"}})}}}}, 0, false},
		{"energy counter ignored", &nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{InstanceStats: map[string]*nomadapi.DeviceStats{
			"x": dev(map[string]*nomadapi.StatValue{"Total energy": {IntNumeratorVal: i(5), Unit: "mJ"}})}}}}, 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w, ok := NodePowerWatts(tc.hs)
			must.Eq(t, tc.ok, ok)
			must.Eq(t, tc.watts, w)
		})
	}
}

func TestNodeWattsFromEnergy(t *testing.T) {
	stats := func(joules, draw float64) *nomadapi.HostStats {
		return &nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{InstanceStats: map[string]*nomadapi.DeviceStats{
			"GPU-0": {Stats: &nomadapi.StatObject{Attributes: map[string]*nomadapi.StatValue{
				"Energy":     {FloatNumeratorVal: f(joules), Unit: "J"},
				"Power draw": {FloatNumeratorVal: f(draw), Unit: "W"},
			}}}}}}}
	}
	s := &Scraper{energy: map[string]energySample{}}
	t0 := time.Unix(1000, 0)
	// First poll: no interval yet, the instantaneous draw.
	w, ok := s.nodeWatts("n", stats(10_000, 250), t0)
	must.True(t, ok)
	must.Eq(t, 250.0, w)
	// 5 s and 1,500 J later: 300 W average, whatever the draw reads now.
	w, ok = s.nodeWatts("n", stats(11_500, 90), t0.Add(5*time.Second))
	must.True(t, ok)
	must.Eq(t, 300.0, w)
	// Counter reset (driver reload): fall back to the draw.
	w, _ = s.nodeWatts("n", stats(5, 120), t0.Add(10*time.Second))
	must.Eq(t, 120.0, w)

	j, ok := NodeEnergyJoules(&nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{InstanceStats: map[string]*nomadapi.DeviceStats{
		"a": {Stats: &nomadapi.StatObject{Attributes: map[string]*nomadapi.StatValue{"Energy": {IntNumeratorVal: i(2000), Unit: "mJ"}}}},
		"b": {Stats: &nomadapi.StatObject{Attributes: map[string]*nomadapi.StatValue{"Energy": {FloatNumeratorVal: f(3), Unit: "J"}}}},
	}}}})
	must.True(t, ok)
	must.Eq(t, 5.0, j)
	_, ok = NodeEnergyJoules(&nomadapi.HostStats{DeviceStats: []*nomadapi.DeviceGroupStats{{InstanceStats: map[string]*nomadapi.DeviceStats{
		"a": {Stats: &nomadapi.StatObject{Attributes: map[string]*nomadapi.StatValue{"Energy": {Unit: "J"}}}}, // N/A
	}}}})
	must.False(t, ok)
}
