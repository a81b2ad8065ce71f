package meshid

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	authorizations   *prometheus.CounterVec
	rotations        *prometheus.CounterVec
	watchErrors      *prometheus.CounterVec
	intentionChanges prometheus.Counter
}

func newMetrics(ns string) *metrics {
	m := &metrics{
		authorizations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "mesh_authorizations_total",
			Help: "Callers checked against Consul intentions, by result (allowed|denied|error: refused) and whether the answer was cached."},
			[]string{"result", "cached"}),
		rotations: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "mesh_rotations_total",
			Help: "New Connect leaf certificates and CA root sets taken into use, by what changed (leaf|roots)."},
			[]string{"what"}),
		watchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "mesh_watch_errors_total",
			Help: "Failed blocking queries on the Connect leaf, roots or intentions (the last answer stays in use)."},
			[]string{"watch"}),
		intentionChanges: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Name: "mesh_intention_changes_total",
			Help: "Changes of the intentions naming this service, each dropping the cached authorizations."}),
	}
	return m
}

// register registers the identity's metrics with reg (none when nil).
func (m *metrics) register(ns string, reg prometheus.Registerer, id *Identity) error {
	if reg == nil {
		return nil
	}
	notAfter := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: ns, Name: "mesh_certificate_not_after_timestamp_seconds",
		Help: "When the presented mesh certificate expires (unix seconds)."},
		func() float64 {
			if c := id.certificate(); c != nil && c.Leaf != nil {
				return float64(c.Leaf.NotAfter.Unix())
			}
			return 0
		})
	for _, c := range []prometheus.Collector{m.authorizations, m.rotations, m.watchErrors, m.intentionChanges, notAfter} {
		if err := reg.Register(c); err != nil {
			return fmt.Errorf("meshid: registering metrics: %w", err)
		}
	}
	return nil
}
