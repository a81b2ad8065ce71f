package testutil

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/shoenig/test/must"
)

func TestScrapeMetricsSum(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(`# TYPE reqs counter
reqs{model="a",code="200"} 3
reqs{model="a",code="500"} 1
reqs{model="b",code="200"} 5
# TYPE inflight gauge
inflight{model="a"} 2
plain 7
`))
	}))
	defer srv.Close()
	m, err := ScrapeMetrics(context.Background(), nil, srv.URL)
	must.NoError(t, err)
	for _, tc := range []struct {
		name string
		want map[string]string
		sum  float64
	}{
		{"reqs", nil, 9},
		{"reqs", map[string]string{"model": "a"}, 4},
		{"reqs", map[string]string{"model": "a", "code": "200"}, 3},
		{"reqs", map[string]string{"model": "c"}, 0},
		{"inflight", map[string]string{"model": "a"}, 2},
		{"plain", nil, 7},
		{"absent", nil, 0},
	} {
		must.Eq(t, tc.sum, m.Sum(tc.name, tc.want), must.Sprintf("%s %v", tc.name, tc.want))
	}
	gone := httptest.NewServer(http.NotFoundHandler())
	defer gone.Close()
	_, err = ScrapeMetrics(context.Background(), nil, gone.URL)
	must.ErrorContains(t, err, "404")
}
