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
	routers         *prometheus.GaugeVec     // dc: routers whose summaries are fresh
	remoteInFlight  *prometheus.GaugeVec     // dc: their in-flight requests, all models
	summaries       *prometheus.CounterVec   // dc: summaries accepted
	peersStale      *prometheus.GaugeVec     // dc
	summaryBytes    prometheus.Gauge
	badEntries      *prometheus.CounterVec // reason
	badSummaries    *prometheus.CounterVec // reason
	wrongDC         *prometheus.CounterVec // dc
	refused         *prometheus.CounterVec // dc, reason: requests the listener refused
	connsRefused    prometheus.Counter
	expired         prometheus.Counter
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
		routers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "remote_routers",
			Help: "Routers of a datacenter whose summaries are fresh (younger than summary_stale): the datacenter's view is their sum."}, []string{"dc"}),
		remoteInFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "remote_in_flight",
			Help: "Requests in flight in a datacenter, all models, as the sum of its routers' fresh summaries says."}, []string{"dc"}),
		summaries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "summaries_received_total",
			Help: "Summaries accepted from another datacenter's routers."}, []string{"dc"}),
		peersStale: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "peers_stale",
			Help: "1 while a datacenter's router list could not be refreshed from Consul."}, []string{"dc"}),
		summaryBytes: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "summary_bytes",
			Help: "Encoded size of the last summary this router pushed."}),
		badEntries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bad_peer_entries_total",
			Help: "Consul registrations of the federation service left out, by reason."}, []string{"reason"}),
		badSummaries: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "bad_summaries_total",
			Help: "Summaries refused, by reason: malformed, wrong_dc (for another datacenter than the caller's certificate names), filter (a prefix filter too small, too large or too full), too_many_dcs, too_many_routers (past the routers kept per datacenter)."},
			[]string{"reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "refused_total",
			Help: "Requests the federation listener refused, by caller datacenter and reason: identity (no certificate naming a datacenter Consul lists, or intentions), rate, in_flight."},
			[]string{"dc", "reason"}),
		connsRefused: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "connections_refused_total",
			Help: "Connections to the federation listener closed because their address already held the per-peer maximum."}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "summaries_expired_total",
			Help: "Datacenters' summaries dropped for being older than the remote state's TTL."}),
		wrongDC: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "wrong_dc_peers_total",
			Help: "Dials of a peer found for dc whose certificate named another datacenter (or none), refused at the handshake."}, []string{"dc"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.forwarded, m.forwardFailures, m.rtt, m.breaker, m.summaryAge, m.routers, m.remoteInFlight, m.summaries,
		m.peersStale, m.summaryBytes, m.badEntries, m.badSummaries, m.wrongDC, m.refused, m.connsRefused, m.expired} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}
