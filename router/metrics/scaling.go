package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
)

// ScalingSample is one model and role's signals for an autoscaler
// (recipes' `scaling` blocks, observability/README.md "Scaling signals").
// Role is the engines' oasis_role (both|prefill|decode); QueueWait is the
// model's, the same on each of its roles.
type ScalingSample struct {
	Model, Role string
	// Workers is the role's routable workers in this router's view.
	Workers int
	// InFlight is the requests this router has in flight to them.
	InFlight int64
	// TTFTP90 is the 90th percentile over the role's workers of each one's
	// estimated time to first token of a new request: its pending uncached
	// prompt tokens over its learned prefill rate.
	TTFTP90 float64
	// TTFTP50 is the median of the same estimates: what most new requests
	// wait for (the router sends each to a worker with a short estimate).
	TTFTP50 float64
	// QueueWait is the estimated wait for an admission slot, in seconds
	// (0 with no in-flight cap or a free slot).
	QueueWait float64
	// KVUsage is the mean KV cache usage (0..1) of the role's workers whose
	// metrics were scraped; HasKV is false when none were.
	KVUsage float64
	HasKV   bool
	// PrefillRate is the median over the role's workers of the prefill rate
	// the router learned for each, uncached prompt tokens per second.
	PrefillRate float64
}

// ScalingCollector exports ScalingSamples computed at scrape time, so the
// figures are as fresh as the scrape: nothing is kept between scrapes.
type ScalingCollector struct {
	source                                             func() []ScalingSample
	workers, inFlight, ttft, ttftMedian, wait, kvUsage *prometheus.Desc
	prefillRate                                        *prometheus.Desc
}

// NewScalingCollector returns a collector that calls source on every scrape.
// Register it on the router's registry.
func NewScalingCollector(source func() []ScalingSample) *ScalingCollector {
	const ns = "oasis_router_scaling_"
	mr := []string{"model", "role"}
	return &ScalingCollector{
		source: source,
		workers: prometheus.NewDesc(ns+"workers",
			"Routable workers per model and role in this router's view (divide by it for per-engine figures).", mr, nil),
		inFlight: prometheus.NewDesc(ns+"in_flight",
			"Requests this router has in flight per model and role (sum over routers, divide by workers: in-flight per engine).", mr, nil),
		ttft: prometheus.NewDesc(ns+"estimated_ttft_p90_seconds",
			"90th percentile over the role's workers of the estimated time to first token of a new request (pending uncached prompt tokens over the learned prefill rate): compare with the model's TTFT SLO.", mr, nil),
		ttftMedian: prometheus.NewDesc(ns+"estimated_ttft_p50_seconds",
			"Median over the role's workers of the same estimate: what most new requests wait, as the router sends each to a worker with a short one.", mr, nil),
		wait: prometheus.NewDesc(ns+"queue_wait_seconds",
			"Estimated wait for an admission slot of the model (requests ahead times the mean request time over max_in_flight; 0 when uncapped or a slot is free).", []string{"model"}, nil),
		kvUsage: prometheus.NewDesc(ns+"kv_usage",
			"Mean KV cache usage (0..1) of the role's workers, from their scraped engine metrics (absent when none were scraped).", mr, nil),
		prefillRate: prometheus.NewDesc(ns+"prefill_tokens_per_second",
			"Median over the role's workers of the prefill rate the router learned for each (uncached prompt tokens per second).", mr, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *ScalingCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.workers, c.inFlight, c.ttft, c.ttftMedian, c.wait, c.kvUsage, c.prefillRate} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *ScalingCollector) Collect(ch chan<- prometheus.Metric) {
	waits := map[string]bool{}
	for _, s := range c.source() {
		ch <- prometheus.MustNewConstMetric(c.workers, prometheus.GaugeValue, float64(s.Workers), s.Model, s.Role)
		ch <- prometheus.MustNewConstMetric(c.inFlight, prometheus.GaugeValue, float64(s.InFlight), s.Model, s.Role)
		ch <- prometheus.MustNewConstMetric(c.ttft, prometheus.GaugeValue, s.TTFTP90, s.Model, s.Role)
		ch <- prometheus.MustNewConstMetric(c.ttftMedian, prometheus.GaugeValue, s.TTFTP50, s.Model, s.Role)
		ch <- prometheus.MustNewConstMetric(c.prefillRate, prometheus.GaugeValue, s.PrefillRate, s.Model, s.Role)
		if s.HasKV {
			ch <- prometheus.MustNewConstMetric(c.kvUsage, prometheus.GaugeValue, s.KVUsage, s.Model, s.Role)
		}
		if !waits[s.Model] {
			waits[s.Model] = true
			ch <- prometheus.MustNewConstMetric(c.wait, prometheus.GaugeValue, s.QueueWait, s.Model)
		}
	}
}

// ScalingCounters count what an arrival-rate autoscaler sizes engines on
// (the Oasis strategy plugin, autoscaler/strategy): requests per model and
// uncached prompt tokens sent per model and engine role.
type ScalingCounters struct {
	// Arrivals counts requests per model the router has served since it
	// started, as routing takes them (before admission or any queueing, with
	// engines up or not): rate() of it is the model's arrival rate. Both roles
	// of a disaggregated model serve each one.
	Arrivals *prometheus.CounterVec // model
	// PrefillTokens counts the uncached prompt tokens the router sent to
	// engines (what it expects them to prefill), per model and role.
	PrefillTokens *prometheus.CounterVec // model, role
}

func newScalingCounters(reg prometheus.Registerer, ns string) ScalingCounters {
	c := ScalingCounters{
		Arrivals: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scaling_arrivals_total",
			Help: "Requests per model the router has served, as it takes them (engines up or not): rate() is the model's arrival rate."}, []string{"model"}),
		PrefillTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scaling_prefill_tokens_total",
			Help: "Uncached prompt tokens sent to engines per model and role (what the router expects them to prefill)."}, []string{"model", "role"}),
	}
	reg.MustRegister(c.Arrivals, c.PrefillTokens)
	return c
}
