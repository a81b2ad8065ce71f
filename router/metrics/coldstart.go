package metrics

import "github.com/prometheus/client_golang/prometheus"

// Hold outcomes of a request held for a model scaled to zero (the outcome
// label of oasis_router_scaling_cold_start_holds_total).
const (
	HoldServed    = "served"    // an engine joined the pool; the request was routed
	HoldTimeout   = "timeout"   // none within the model's hold: 503
	HoldFull      = "full"      // max_held requests already held: 503 at once
	HoldCancelled = "cancelled" // the client left or its deadline passed first
)

// HoldOutcomes lists every outcome label.
func HoldOutcomes() []string { return []string{HoldServed, HoldTimeout, HoldFull, HoldCancelled} }

// ColdStart are the instruments of scale to zero (gateway coldstart.go):
// what an autoscaler starts a model's first engine on, and what the wait
// cost.
type ColdStart struct {
	// Held is the requests held now, per model, waiting for an engine.
	Held *prometheus.GaugeVec // model
	// Holds counts holds by outcome.
	Holds *prometheus.CounterVec // model, outcome
	// HoldWait is a served hold's wait, from the hold to an engine in the
	// pool: the cold start the client saw before its request was sent.
	HoldWait *prometheus.HistogramVec // model
}

func newColdStart(reg prometheus.Registerer, ns string) ColdStart {
	c := ColdStart{
		Held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "scaling_held_requests",
			Help: "Requests held for a model with no healthy engine (policy scale_to_zero) until one joins the pool: scale the model from zero while it is above 0 (sum over routers)."},
			[]string{"model"}),
		Holds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "scaling_cold_start_holds_total",
			Help: "Requests held for a model scaled to zero, by outcome: served (an engine joined the pool in time), timeout (503 after the hold), full (503 at once: max_held reached), cancelled (the client left or its deadline passed)."},
			[]string{"model", "outcome"}),
		HoldWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "scaling_cold_start_wait_seconds",
			Help:    "Wait of held requests that were served, from the hold to an engine of the model in the pool (the cold start seen by clients, before their request is sent).",
			Buckets: []float64{.5, 1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900}},
			[]string{"model"}),
	}
	reg.MustRegister(c.Held, c.Holds, c.HoldWait)
	return c
}

// ColdStartModel makes model's scale-to-zero series exist at zero, so the
// autoscaler's query and rate() over the counters have data before the
// first hold ends.
func (c ColdStart) ColdStartModel(model string) {
	c.Held.WithLabelValues(model)
	for _, o := range HoldOutcomes() {
		c.Holds.WithLabelValues(model, o)
	}
}
