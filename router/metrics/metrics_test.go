package metrics

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func value(t *testing.T, c prometheus.Metric) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	t.Fatalf("unexpected metric type %v", &m)
	return 0
}

func TestCachedSeriesAreTheVectorsSeries(t *testing.T) {
	m := New(prometheus.NewRegistry())
	w := m.Worker("llama", "w1")
	if m.Worker("llama", "w1") != w {
		t.Fatal("second lookup returned a different series set")
	}
	if m.Worker("llama", "w2") == w || m.Worker("qwen", "w1") == w {
		t.Fatal("different model or worker shares a series set")
	}
	w.Requests(200).Inc()
	w.Requests(200).Inc()
	w.Requests(502).Inc()
	w.InFlight.Inc()
	w.PromptTokens.Add(7)
	if got := value(t, m.Requests.WithLabelValues("llama", "200", "w1")); got != 2 {
		t.Fatalf("requests_total{status=200} = %v, want 2", got)
	}
	if got := value(t, m.Requests.WithLabelValues("llama", "502", "w1")); got != 1 {
		t.Fatalf("requests_total{status=502} = %v, want 1", got)
	}
	if got := value(t, m.WorkerInFlight.WithLabelValues("llama", "w1")); got != 1 {
		t.Fatalf("worker_in_flight = %v, want 1", got)
	}
	if got := value(t, m.Tokens.WithLabelValues("llama", "w1", "prompt")); got != 7 {
		t.Fatalf("tokens_total{kind=prompt} = %v, want 7", got)
	}

	s := m.Model("llama")
	if m.Model("llama") != s {
		t.Fatal("second model lookup returned a different series set")
	}
	s.Duration.Observe(0.25)
	if got := value(t, m.Duration.WithLabelValues("llama").(prometheus.Metric)); got != 1 {
		t.Fatalf("request_duration_seconds{model=llama} has %v samples, want 1", got)
	}
}
