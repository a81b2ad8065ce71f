package metrics

import "github.com/prometheus/client_golang/prometheus"

// Cascade are the instruments of cascades and overflow (gateway cascade.go,
// overflow.go).
type Cascade struct {
	// CascadeRequests counts requests for cascade aliases by outcome:
	// small (the small answer cleared the gate), escalated (the large
	// model answered), small_failed (the small leg failed; escalated too).
	CascadeRequests *prometheus.CounterVec // alias, outcome
	// CascadeLeg is each leg's time: small to its whole buffered answer,
	// large to the end of its answer.
	CascadeLeg *prometheus.HistogramVec // alias, leg (small|large)
	// CascadeSmallTokens are the small legs' tokens, from the engines'
	// usage (the large legs' count in Tokens under the large model).
	CascadeSmallTokens *prometheus.CounterVec // alias, outcome, kind (prompt|completion)
	// Overflowed counts requests sent to a model's overflow pool.
	Overflowed *prometheus.CounterVec // model, reason
}

func newCascade(reg prometheus.Registerer, ns string, lat []float64) Cascade {
	c := Cascade{
		CascadeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "cascade_requests_total",
			Help: "Requests for cascade aliases by outcome: small (the small model's answer cleared the gate), escalated (its answer did not; the large model answered), small_failed (the small leg failed; the large model answered)."},
			[]string{"alias", "outcome"}),
		CascadeLeg: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "cascade_leg_seconds",
			Help: "Time of each cascade leg: small (sent to its whole buffered answer), large (sent to the end of its relayed answer).", Buckets: lat},
			[]string{"alias", "leg"}),
		CascadeSmallTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "cascade_small_tokens_total",
			Help: "Tokens of cascades' small legs from the engine's usage, by outcome (small|escalated) and kind (prompt|completion); the large legs' count in tokens_total under the large model."},
			[]string{"alias", "outcome", "kind"}),
		Overflowed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "overflow_requests_total",
			Help: "Requests sent to a model's overflow pool, by model and reason (queue_full|queue_timeout|no_worker|ttft_over)."},
			[]string{"model", "reason"}),
	}
	reg.MustRegister(c.CascadeRequests, c.CascadeLeg, c.CascadeSmallTokens, c.Overflowed)
	return c
}
