package federation

import (
	"github.com/prometheus/client_golang/prometheus"
)

type fedMetrics struct {
	forwarded       *prometheus.CounterVec   // dc, reason
	forwardFailures *prometheus.CounterVec   // dc
	rtt             *prometheus.HistogramVec // dc
	breaker         *prometheus.GaugeVec     // dc
	summaryAge      *prometheus.GaugeVec     // dc
	peersStale      *prometheus.GaugeVec     // dc
	summaryBytes    prometheus.Gauge
	badEntries      *prometheus.CounterVec // reason
	badSummaries    prometheus.Counter
	wrongDC         *prometheus.CounterVec // dc
}

func newMetrics(reg prometheus.Registerer) (*fedMetrics, error) {
	const ns, sub = "oasis_router", "federation"
	m := &fedMetrics{
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forwarded_total",
			Help: "Requests sent to another datacenter's router, by destination and reason."}, []string{"dc", "reason"}),
		forwardFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "forward_failures_total",
			Help: "Forwarded requests that failed before their first byte."}, []string{"dc"}),
		rtt: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "rtt_seconds",
			Help:    "Round trip of a summary push to another datacenter's router.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)}, []string{"dc"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "breaker_state",
			Help: "A datacenter's circuit: 0 closed, 1 open, 2 half-open."}, []string{"dc"}),
		summaryAge: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "summary_age_seconds",
			Help: "Age of the last summary received from a datacenter."}, []string{"dc"}),
		peersStale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "peers_stale",
			Help: "1 while a datacenter's router list could not be refreshed from Consul."}, []string{"dc"}),
		summaryBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "summary_bytes",
			Help: "Encoded size of the last summary this router pushed."}),
		badEntries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bad_peer_entries_total",
			Help: "Consul registrations of the federation service left out, by reason."}, []string{"reason"}),
		badSummaries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bad_summaries_total",
			Help: "Summaries refused as malformed, from too many datacenters, or (in the mesh) for another datacenter than the caller's certificate names."}),
		wrongDC: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "wrong_dc_peers_total",
			Help: "Requests to a peer found for dc whose certificate named another datacenter (mesh identities), refused."}, []string{"dc"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.forwarded, m.forwardFailures, m.rtt, m.breaker, m.summaryAge,
		m.peersStale, m.summaryBytes, m.badEntries, m.badSummaries, m.wrongDC} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
