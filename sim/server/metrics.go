package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are vLLM's Prometheus series (names, types, label "model_name" and bucket
// layouts as in vllm/v1/metrics/loggers.py) plus oasis-sim's power gauges.
type metrics struct {
	reg          *prometheus.Registry
	ttft         prometheus.Observer
	itl          prometheus.Observer
	e2e          prometheus.Observer
	promptTokens prometheus.Counter
	genTokens    prometheus.Counter
	success      *prometheus.CounterVec
	promptHist   prometheus.Observer
	genHist      prometheus.Observer
	// Disaggregated prefill/decode.
	promptBySource *prometheus.CounterVec // source: local | remote
	kvBlocks       *prometheus.CounterVec // direction: sent | received
	kvSeconds      prometheus.Observer
	kvFailures     *prometheus.CounterVec // reason
}

// kvTransferBuckets span a few blocks over a fast link to long prompts over a slow one.
var kvTransferBuckets = []float64{0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

func sourceLabel(remote bool) string {
	if remote {
		return "remote"
	}
	return "local"
}

var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
	tokBuckets  = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}
)

func newMetrics(s *Server) *metrics {
	reg := prometheus.NewRegistry()
	labels := prometheus.Labels{"model_name": s.modelName, "engine": "0"}
	hist := func(name, help string, b []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: labels})
		reg.MustRegister(h)
		return h
	}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		reg.MustRegister(c)
		return c
	}
	m := &metrics{
		reg:          reg,
		ttft:         hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:          hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:          hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets),
		promptHist:   hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokBuckets),
		genHist:      hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokBuckets),
		promptTokens: counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:    counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		success: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels},
			[]string{"finished_reason"}),
	}
	reg.MustRegister(m.success)
	for _, r := range []string{"stop", "length", "abort"} {
		m.success.WithLabelValues(r)
	}
	m.kvSeconds = hist("oasis_sim_kv_transfer_seconds", "Simulated KV transfer time of decode legs whose prompt KV came from a prefill engine.", kvTransferBuckets)
	vec := func(name, help, label string, values ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, []string{label})
		reg.MustRegister(v)
		for _, x := range values {
			v.WithLabelValues(x)
		}
		return v
	}
	m.promptBySource = vec("oasis_sim_prompt_tokens_total", "Prompt tokens of finished requests by where their KV came from: computed here (local) or transferred from a prefill engine (remote).", "source", "local", "remote")
	m.kvBlocks = vec("oasis_sim_kv_transfer_blocks_total", "KV blocks transferred between engines: sent (pulled from this prefill engine) or received (by this decode engine).", "direction", "sent", "received")
	m.kvFailures = vec("oasis_sim_kv_transfer_failures_total", "Failed KV transfers by reason: unreachable, not_found, mismatch, invalid_response on decode legs; expired (held KV nobody pulled) on prefill engines.", "reason",
		"unreachable", "not_found", "mismatch", "invalid_response", "expired")
	reg.MustRegister(&stateCollector{s: s, labels: labels})
	return m
}

// stateCollector reads the engine's gauges and cumulative cache counters at scrape
// time, so the hot path keeps no extra state.
type stateCollector struct {
	s      *Server
	labels prometheus.Labels
}

func (c *stateCollector) desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, nil, c.labels)
}

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	prometheus.DescribeByCollect(c, ch)
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	st, util := c.s.snapshot()
	g := func(name, help string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.desc(name, help), prometheus.GaugeValue, v)
	}
	k := func(name, help string, v float64) {
		ch <- prometheus.MustNewConstMetric(c.desc(name, help), prometheus.CounterValue, v)
	}
	g("vllm:num_requests_running", "Number of requests in model execution batches.", float64(st.Running))
	g("vllm:num_requests_waiting", "Number of requests waiting to be processed.", float64(st.Waiting))
	g("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", st.KVUsage)
	g("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (pre-V1 name). 1 means 100 percent usage.", st.KVUsage)
	k("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", float64(st.PrefixQueries))
	k("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", float64(st.PrefixHits))
	k("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", float64(st.Preemptions))
	ch <- prometheus.MustNewConstMetric(
		prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
			[]string{"block_size", "num_gpu_blocks", "enable_prefix_caching"}, c.labels),
		prometheus.GaugeValue, 1,
		itoa(c.s.eng.Config().BlockSize), itoa(st.NumGPUBlocks), boolStr(!c.s.eng.Config().DisablePrefixCaching))
	g("oasis_sim_gpu_utilization", "Simulated GPU busy fraction over the last second (0..1).", util)
	g("oasis_sim_power_watts", "Simulated GPU power draw: idle + watts-per-util × utilization.", c.s.cfg.Power.Watts(util))
	g("oasis_sim_cached_blocks", "KV blocks currently registered in the prefix cache.", float64(st.CachedBlocks))
	g("oasis_sim_kv_held_blocks", "KV blocks of finished prefill legs held for their decode legs.", float64(st.HeldBlocks))
	if c.s.eng.Config().CPUBlocks > 0 {
		g("oasis_sim_cpu_cached_blocks", "KV blocks held by the simulated CPU offloading tier.", float64(st.CPUCachedBlocks))
		k("oasis_sim_cpu_cache_hits_total", "Prompt tokens loaded from the CPU offloading tier instead of recomputed.", float64(st.CPUHits))
	}
}

func boolStr(b bool) string {
	if b {
		return "True"
	}
	return "False"
}
