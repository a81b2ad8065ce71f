package scoring

import "context"

// KVCapacityTerm ("kv_capacity") prefers workers with free KV cache:
// 1 − kv_usage, where kv_usage is the engine's reported fraction of KV blocks
// in use (vllm:kv_cache_usage_perc, sglang:token_usage, ...). Workers whose
// metrics are unknown score Neutral.
type KVCapacityTerm struct{}

func (KVCapacityTerm) Name() string { return "kv_capacity" }

func (KVCapacityTerm) Score(_ context.Context, _ *Request, workers []*Worker, out []float64) {
	for i, w := range workers {
		s := w.Signals()
		if !s.EngineMetrics {
			out[i] = Neutral
			continue
		}
		out[i] = clamp01(1 - s.KVUsage)
	}
}

func clamp01(v float64) float64 {
	switch {
	case v < 0 || v != v:
		return 0
	case v > 1:
		return 1
	}
	return v
}
