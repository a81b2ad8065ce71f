// Package metrics defines every Prometheus metric oasis-router exports, in one
// place, registered on a registry the caller owns (never the default one).
package metrics

import (
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the router's instruments.
type Metrics struct {
	Requests         *prometheus.CounterVec   // model, status, worker
	TTFT             *prometheus.HistogramVec // model
	Duration         *prometheus.HistogramVec // model
	RoutingDecision  prometheus.Histogram
	WorkerInFlight   *prometheus.GaugeVec // model, worker
	Workers          *prometheus.GaugeVec // model
	Retries          *prometheus.CounterVec
	AdmissionRefused *prometheus.CounterVec // model, reason
	Queued           *prometheus.GaugeVec   // model
	Tokens           *prometheus.CounterVec // model, worker, kind (prompt|completion), from engine usage

	PolicyReloads prometheus.Counter
	PolicyRejects prometheus.Counter

	DiscoveryStale       prometheus.Gauge // 1 while the worker view could not be refreshed
	DiscoveryLastSuccess prometheus.Gauge // unix seconds of the last successful refresh
	DiscoveryErrors      prometheus.Counter

	ScrapeErrors *prometheus.CounterVec // worker
	RateLimited  prometheus.Counter
	AuthFailures prometheus.Counter
	KeyReloads   *prometheus.CounterVec // result

	// Upstream failures the gateway turns into clean errors.
	UpstreamTimeouts *prometheus.CounterVec // model, phase (response_header|first_token|stream_idle)
	StreamErrors     *prometheus.CounterVec // model, reason: a stream ended with an SSE error event

	PrefixRequestBlocks *prometheus.CounterVec // model
	PrefixMatchedBlocks *prometheus.CounterVec // model
	WorkerPower         *prometheus.GaugeVec   // model, worker, node

	// Engine registrations left out of the pool because the operator's
	// allow-list refuses their hosted upstream (discovery.HostedPolicy).
	HostedRejected *prometheus.CounterVec // reason

	// Engine registrations left out of the pool because a service meta
	// value is malformed (discovery.MetaError): anyone who can register a
	// service writes meta.
	MetaRejected *prometheus.CounterVec // key

	// Workers taken out of routing after connect failures in a row
	// (gateway eject.go).
	Ejections *prometheus.CounterVec // model

	// Disaggregated prefill/decode (gateway disagg.go).
	DisaggRequests *prometheus.CounterVec   // model, path (pair|direct|fallback)
	PrefillLeg     *prometheus.HistogramVec // model: a prefill leg's time to its answer
	DisaggFailures *prometheus.CounterVec   // model, leg (prefill|decode)

	// Reads of Nomad node statistics for GPU power (-power-from-nomad):
	// errors are how a missing ACL policy shows.
	NodeStatsReads *prometheus.CounterVec // result (ok|error)

	// GPU instances Nomad fingerprints on the workers' nodes by health, read
	// with the node statistics: the device plugin marks a GPU unhealthy on a
	// critical Xid or when it falls off the bus.
	NodeGPUs *prometheus.GaugeVec // node, health (healthy|unhealthy)

	// Cascades and overflow (cascade.go).
	Cascade

	// Requests held for models scaled to zero (coldstart.go).
	ColdStart

	// Bounds on what registrations and engines can make the router hold (bounds.go).
	Bounds
	// Routing loops and client connections (protection.go).
	Protection
	// State shared with the datacenter's other routers (peers.go).
	Peers
	// In-flight stream migration (migration.go).
	Migration
	// Arrivals and prefill tokens for arrival-rate autoscaling (scaling.go).
	Scaling ScalingCounters

	// Series the request path uses on every request, resolved once per
	// model / worker: a label lookup hashes every label value and takes the
	// vector's lock, which showed up in the router's CPU profile.
	models  sync.Map // model → *ModelSeries
	workers sync.Map // workerKey → *WorkerSeries
}

// ModelSeries are the per-model series of the request path.
type ModelSeries struct {
	TTFT     prometheus.Observer
	Duration prometheus.Observer
}

// WorkerSeries are the per-worker series of the request path.
type WorkerSeries struct {
	InFlight         prometheus.Gauge
	OK               prometheus.Counter // requests_total{status="200"}
	PromptTokens     prometheus.Counter
	CompletionTokens prometheus.Counter

	model, worker string
	requests      *prometheus.CounterVec
}

// Requests returns requests_total for this worker and status.
func (w *WorkerSeries) Requests(status int) prometheus.Counter {
	if status == 200 {
		return w.OK
	}
	return w.requests.WithLabelValues(w.model, strconv.Itoa(status), w.worker)
}

// AdmissionReasons returns the admission_refused_total reasons.
func AdmissionReasons() []string { return []string{"queue_full", "queue_timeout", "deadline"} }

type workerKey struct{ model, worker string }

// Model returns the request-path series of one model (the label value is the
// caller's: bound its cardinality before calling).
func (m *Metrics) Model(model string) *ModelSeries {
	if s, ok := m.models.Load(model); ok {
		return s.(*ModelSeries)
	}
	s, loaded := m.models.LoadOrStore(model, &ModelSeries{TTFT: m.TTFT.WithLabelValues(model),
		Duration: m.Duration.WithLabelValues(model)})
	if !loaded {
		// Counters of rare events start at zero with the model rather than at
		// its first event: rate() over a series that does not exist yet is
		// empty, and a dashboard panel or alert on it shows nothing.
		m.Retries.WithLabelValues(model)
		for _, reason := range AdmissionReasons() {
			m.AdmissionRefused.WithLabelValues(model, reason)
		}
	}
	return s.(*ModelSeries)
}

// Worker returns the request-path series of one worker of a model.
func (m *Metrics) Worker(model, worker string) *WorkerSeries {
	k := workerKey{model, worker}
	if s, ok := m.workers.Load(k); ok {
		return s.(*WorkerSeries)
	}
	s, _ := m.workers.LoadOrStore(k, &WorkerSeries{
		InFlight:         m.WorkerInFlight.WithLabelValues(model, worker),
		OK:               m.Requests.WithLabelValues(model, "200", worker),
		PromptTokens:     m.Tokens.WithLabelValues(model, worker, "prompt"),
		CompletionTokens: m.Tokens.WithLabelValues(model, worker, "completion"),
		model:            model, worker: worker, requests: m.Requests,
	})
	return s.(*WorkerSeries)
}

// New creates the instruments and registers them on reg.
func New(reg prometheus.Registerer) *Metrics {
	const ns = "oasis_router"
	lat := []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}
	m := &Metrics{
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "requests_total",
			Help: "Requests by model, HTTP status and the worker that served them (\"\" when none did)."}, []string{"model", "status", "worker"}),
		TTFT: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "time_to_first_byte_seconds",
			Help: "From request arrival to the first response byte sent to the client (first token for streams).", Buckets: lat}, []string{"model"}),
		Duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "request_duration_seconds",
			Help: "End-to-end request latency.", Buckets: lat}, []string{"model"}),
		RoutingDecision: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Name: "routing_decision_seconds",
			Help: "Time to choose a worker.", Buckets: []float64{1e-6, 5e-6, 1e-5, 5e-5, 1e-4, 5e-4, 1e-3, 5e-3, 1e-2, 5e-2}}),
		WorkerInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "worker_in_flight",
			Help: "Requests this router has in flight per worker."}, []string{"model", "worker"}),
		Workers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "workers",
			Help: "Healthy workers per model in the current view."}, []string{"model"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "retries_total",
			Help: "Requests retried on another worker after a connect failure or a 5xx before the first byte."}, []string{"model"}),
		AdmissionRefused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "admission_refused_total",
			Help: "Requests refused by admission control (queue_full → 429, queue_timeout → 503, deadline → 504)."}, []string{"model", "reason"}),
		Queued: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "queued",
			Help: "Requests waiting for an in-flight slot."}, []string{"model"}),
		Tokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "tokens_total",
			Help: "Tokens reported in the engines' usage objects."}, []string{"model", "worker", "kind"}),
		PolicyReloads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "policy_reloads_total",
			Help: "Policy documents applied."}),
		PolicyRejects: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "policy_rejects_total",
			Help: "Policy documents rejected as invalid (the last good one stays)."}),
		DiscoveryStale: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "discovery_stale",
			Help: "1 while the worker view could not be refreshed from Consul/Nomad and the last known pool is serving."}),
		DiscoveryLastSuccess: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "discovery_last_success_timestamp_seconds",
			Help: "Unix time of the last successful discovery query."}),
		DiscoveryErrors: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "discovery_errors_total",
			Help: "Failed discovery queries."}),
		ScrapeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "engine_scrape_errors_total",
			Help: "Failed scrapes of engine metrics."}, []string{"worker"}),
		RateLimited: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "rate_limited_total",
			Help: "Requests refused by a per-key rate limit."}),
		AuthFailures: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "auth_failures_total",
			Help: "Requests with a missing or unknown API key."}),
		KeyReloads: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "api_key_reloads_total",
			Help: "API key set reloads by result (ok|rejected)."}, []string{"result"}),
		UpstreamTimeouts: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "upstream_timeouts_total",
			Help: "Engine requests that timed out, by phase: response_header (no response head), first_token (no first token), stream_idle (no event between two)."}, []string{"model", "phase"}),
		StreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "stream_errors_total",
			Help: "Streams that failed after their first byte and ended with an SSE error event, by reason (upstream_broken|stream_idle|deadline)."}, []string{"model", "reason"}),
		PrefixRequestBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_request_blocks_total",
			Help: "Full KV blocks in the prompts routed with the prefix term."}, []string{"model"}),
		PrefixMatchedBlocks: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "prefix_matched_blocks_total",
			Help: "Of those, blocks the chosen worker already held (any tier) by the router's index at decision time."}, []string{"model"}),
		WorkerPower: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "worker_power_watts",
			Help: "GPU power attributed to each worker: its own gauge (oasis-sim) or its Nomad node's GPU power shared by the engines there."}, []string{"model", "worker", "node"}),
	}
	reg.MustRegister(m.Requests, m.TTFT, m.Duration, m.RoutingDecision, m.WorkerInFlight, m.Workers,
		m.Retries, m.AdmissionRefused, m.Queued, m.Tokens, m.PolicyReloads, m.PolicyRejects,
		m.DiscoveryStale, m.DiscoveryLastSuccess, m.DiscoveryErrors, m.ScrapeErrors, m.RateLimited,
		m.AuthFailures, m.KeyReloads, m.UpstreamTimeouts, m.StreamErrors, m.PrefixRequestBlocks, m.PrefixMatchedBlocks, m.WorkerPower)

	m.HostedRejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "hosted_rejected_total",
		Help: "Engine registrations ignored because their hosted upstream (oasis_upstream, oasis_upstream_key_env) is not allow-listed, once per instance and value, by reason (invalid_upstream|upstream_not_allowed|key_env_not_allowed|key_env_without_upstream)."},
		[]string{"reason"})
	m.NodeStatsReads = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "nomad_node_stats_reads_total",
		Help: "Reads of Nomad node statistics for GPU power (-power-from-nomad), by result (ok|error)."}, []string{"result"})
	m.NodeGPUs = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "node_gpus",
		Help: "GPU instances Nomad fingerprints on each worker's node, by health (healthy|unhealthy; -power-from-nomad): the device plugin marks a GPU unhealthy on a critical Xid or when it falls off the bus."},
		[]string{"node", "health"})
	m.MetaRejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "meta_rejected_total",
		Help: "Engine registrations ignored because a service meta value is invalid, once per instance and value, by meta key (oasis_role|oasis_pd_protocol|oasis_bootstrap_port|oasis_kv_capacity|oasis_metrics_path)."},
		[]string{"key"})
	m.Ejections = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "worker_ejections_total",
		Help: "Workers taken out of routing for a while after connections to them failed several times in a row (-eject-after, -eject-for), by model."},
		[]string{"model"})
	m.DisaggRequests = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disagg_requests_total",
		Help: "Requests for models with prefill workers, by path: pair (prefill leg, then decode leg), direct (to a decode or aggregated worker: disaggregation off or too few uncached tokens), fallback (prefill legs failed; served without a remote prefill)."},
		[]string{"model", "path"})
	m.PrefillLeg = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "prefill_leg_seconds",
		Help: "Time from sending a prefill leg to its answer (vLLM protocol: the prefill and its one token; SGLang: the response head).", Buckets: lat},
		[]string{"model"})
	m.DisaggFailures = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "disagg_failures_total",
		Help: "Failed legs of disaggregated requests (before the client saw a byte), by leg (prefill|decode)."},
		[]string{"model", "leg"})
	reg.MustRegister(m.HostedRejected, m.NodeStatsReads, m.NodeGPUs, m.MetaRejected, m.Ejections, m.DisaggRequests, m.PrefillLeg, m.DisaggFailures)
	m.Cascade = newCascade(reg, ns, lat)
	m.ColdStart = newColdStart(reg, ns)
	m.Protection = newProtection(reg, ns)
	m.Migration = newMigration(reg, ns)
	m.Bounds = newBounds(reg, ns)
	m.Peers = newPeers(reg)
	m.Scaling = newScalingCounters(reg, ns)
	return m
}
