// Package enginestats gathers the live load and power signals the scoring terms
// read: each engine's Prometheus metrics and GPU power per Nomad node.
package enginestats

import (
	"fmt"
	"io"
	"math"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metric names per engine; the first present name wins. TensorRT-LLM's
// trtllm-serve exports its trtllm_* series on /prometheus/metrics (its
// /metrics is JSON iteration stats); the load and KV gauges there exist only
// when the server runs with enable_iter_perf_stats (router/README.md).
var (
	runningNames = []string{"vllm:num_requests_running", "sglang:num_running_reqs", "llamacpp:requests_processing", "trtllm_num_requests_running"}
	waitingNames = []string{"vllm:num_requests_waiting", "sglang:num_queue_reqs", "llamacpp:requests_deferred", "trtllm_num_requests_waiting"}
	kvUsageNames = []string{"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage", "llamacpp:kv_cache_usage_ratio", "trtllm_kv_cache_utilization"}
	genTokNames  = []string{"vllm:generation_tokens_total", "sglang:generation_tokens_total", "llamacpp:tokens_predicted_total", "trtllm_generation_tokens_total"}
)

// EngineMetrics is what the router reads from an engine's metrics page.
type EngineMetrics struct {
	Running, Waiting, KVUsage float64
	HasLoad                   bool // running or waiting present
	GenTokens                 float64
	HasGenTokens              bool
	PowerWatts                float64 // the engine's own power gauge (oasis-sim)
	HasPower                  bool
}

// ParseEngineMetrics reads Prometheus text exposition. Series of one name are
// summed (an engine may label by model or rank). powerNames are gauge names in
// watts the engine may expose.
func ParseEngineMetrics(r io.Reader, powerNames []string) (EngineMetrics, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return EngineMetrics{}, fmt.Errorf("parsing engine metrics: %w", err)
	}
	var m EngineMetrics
	var ok bool
	if m.Running, ok = first(fams, runningNames); ok {
		m.HasLoad = true
	}
	if m.Waiting, ok = first(fams, waitingNames); ok {
		m.HasLoad = true
	}
	m.KVUsage, _ = first(fams, kvUsageNames)
	m.GenTokens, m.HasGenTokens = first(fams, genTokNames)
	m.PowerWatts, m.HasPower = first(fams, powerNames)
	return m, nil
}

func first(fams map[string]*dto.MetricFamily, names []string) (float64, bool) {
	for _, n := range names {
		f, ok := fams[n]
		if !ok {
			// Counters may be exposed without the _total suffix in the family name.
			f, ok = fams[strings.TrimSuffix(n, "_total")]
		}
		if !ok || len(f.Metric) == 0 {
			continue
		}
		sum := 0.0
		for _, mt := range f.Metric {
			switch {
			case mt.Gauge != nil:
				sum += mt.Gauge.GetValue()
			case mt.Counter != nil:
				sum += mt.Counter.GetValue()
			case mt.Untyped != nil:
				sum += mt.Untyped.GetValue()
			}
		}
		if math.IsNaN(sum) || math.IsInf(sum, 0) {
			continue
		}
		// Every signal read here is a count, a fraction or watts: a
		// negative value is an engine's bug (or a lie to attract traffic
		// through the load terms), read as 0.
		return max(sum, 0), true
	}
	return 0, false
}
