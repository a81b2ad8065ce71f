package metrics

import "github.com/prometheus/client_golang/prometheus"

// Bounds count what the router refused or bounded because a registration
// or an engine asked for more than the router gives anyone: memory for its
// cache index, or answers too large to read.
type Bounds struct {
	// KVCapacityClamped counts engines whose advertised cache
	// (oasis_kv_capacity) was cut to the per-worker bound of the router's
	// approximate record (cachestate.Config.MaxWorkerBlocks), once per
	// registration.
	KVCapacityClamped prometheus.Counter
	// IndexBudgetEvictions counts prefix-index entries evicted to keep the
	// index within its global budget (cachestate.Config.MaxIndexBlocks), by
	// index (events|approx).
	IndexBudgetEvictions *prometheus.CounterVec
	// EngineAnswerRefused counts engine answers refused unread past their
	// bound, by engine (the registration's oasis_engine, one of the known
	// engines or "other") and kind (metrics|tokenize).
	EngineAnswerRefused *prometheus.CounterVec
}

// EngineLabel bounds the engine label of EngineAnswerRefused: oasis_engine
// is the registrant's text.
func EngineLabel(engine string) string {
	switch engine {
	case "vllm", "sglang", "llama_cpp", "trtllm", "openai_compat", "sim":
		return engine
	}
	return "other"
}

func newBounds(reg prometheus.Registerer, ns string) Bounds {
	g := Bounds{
		KVCapacityClamped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "kv_capacity_clamped_total",
			Help: "Engines whose advertised oasis_kv_capacity exceeded the per-worker bound of the approximate record (-index-worker-max-blocks) and was cut to it, once per registration."}),
		IndexBudgetEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_index_budget_evictions_total",
			Help: "Prefix-index entries evicted, least recently stored first across workers, to keep an index within its global budget (-index-max-blocks), by index (events|approx|inflight: the in-flight record of decisions to engines with KV events, bounded by its own budget, at most -index-max-blocks)."},
			[]string{"index"}),
		EngineAnswerRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "engine_answer_refused_total",
			Help: "Engine answers the router refused because they exceeded their bound (metrics: the /metrics page; tokenize: a /tokenize answer longer than the prompt can tokenize to), by engine (oasis_engine) and kind (metrics|tokenize)."},
			[]string{"engine", "kind"}),
	}
	for _, index := range []string{"events", "approx", "inflight"} {
		g.IndexBudgetEvictions.WithLabelValues(index)
	}
	reg.MustRegister(g.KVCapacityClamped, g.IndexBudgetEvictions, g.EngineAnswerRefused)
	return g
}
