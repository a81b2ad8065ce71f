package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"
)

// TestColdStartModelStartsSeriesAtZero: a model's first hold creates its held
// gauge and every outcome's counter at zero, so the autoscaler's query and
// rate() over the outcomes have data before the first hold ends.
func TestColdStartModelStartsSeriesAtZero(t *testing.T) {
	m := New(prometheus.NewRegistry())
	must.Zero(t, testutil.CollectAndCount(m.Held))
	m.ColdStartModel("tiny")
	must.Eq(t, 1, testutil.CollectAndCount(m.Held))
	must.Eq(t, len(HoldOutcomes()), testutil.CollectAndCount(m.Holds))
	must.Zero(t, testutil.ToFloat64(m.Held.WithLabelValues("tiny")))
	m.ColdStartModel("tiny")
	must.Eq(t, len(HoldOutcomes()), testutil.CollectAndCount(m.Holds))
}
