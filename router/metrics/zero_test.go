package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"
)

// TestModelStartsRareCountersAtZero: a model's first request creates its
// retry and admission-refusal series at zero, so rate() over them has data
// before the first retry or refusal.
func TestModelStartsRareCountersAtZero(t *testing.T) {
	m := New(prometheus.NewRegistry())
	must.Eq(t, 0, testutil.CollectAndCount(m.Retries))
	m.Model("tiny")
	must.Eq(t, 1, testutil.CollectAndCount(m.Retries))
	must.Eq(t, len(AdmissionReasons()), testutil.CollectAndCount(m.AdmissionRefused))
	m.Model("tiny")
	must.Eq(t, 1, testutil.CollectAndCount(m.Retries))
}
