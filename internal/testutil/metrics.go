package testutil

import (
	"context"
	"fmt"
	"net/http"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics is one scrape of a Prometheus text endpoint: family name → family.
type Metrics map[string]*dto.MetricFamily

// ScrapeMetrics GETs url (a /metrics page) with client (nil: http.DefaultClient) and parses it.
func ScrapeMetrics(ctx context.Context, client *http.Client, url string) (Metrics, error) {
	if client == nil {
		client = http.DefaultClient
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", url, resp.Status)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("parsing %s: %w", url, err)
	}
	return fams, nil
}

// Sum adds the counter, gauge and untyped values of the family's series whose labels include
// every pair of want (nil: all series); 0 when the family is absent.
func (m Metrics) Sum(name string, want map[string]string) float64 {
	f, ok := m[name]
	if !ok {
		return 0
	}
	var sum float64
	for _, s := range f.GetMetric() {
		if !hasLabels(s, want) {
			continue
		}
		sum += s.GetCounter().GetValue() + s.GetGauge().GetValue() + s.GetUntyped().GetValue()
	}
	return sum
}

func hasLabels(s *dto.Metric, want map[string]string) bool {
	for k, v := range want {
		found := false
		for _, l := range s.GetLabel() {
			found = found || (l.GetName() == k && l.GetValue() == v)
		}
		if !found {
			return false
		}
	}
	return true
}
