package discovery

import (
	"errors"
	"net/url"
	"path"
	"strings"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"
)

// oasis_metrics_path chooses the path of a GET the router makes every
// second to the engine's address: only a plain absolute path is accepted,
// anything else leaves the instance out and counts in
// oasis_router_meta_rejected_total{key="oasis_metrics_path"}.
func TestMetricsPathMeta(t *testing.T) {
	cases := []struct {
		name, path string
		want       string // the worker's MetricsPath; "" when refused
	}{
		{"default", "", "/metrics"},
		{"vllm", "/metrics", "/metrics"},
		{"trtllm", "/prometheus/metrics", "/prometheus/metrics"},
		{"trailing slash", "/metrics/", "/metrics/"},
		{"dots inside a name", "/v1.2/metrics_x-y~z", "/v1.2/metrics_x-y~z"},
		{"userinfo moves the host", "@169.254.169.254/latest/meta-data", ""},
		{"relative", "metrics", ""},
		{"scheme", "http://evil.example/metrics", ""},
		{"scheme-relative", "//evil.example/metrics", ""},
		{"empty segment", "/a//metrics", ""},
		{"dot dot", "/metrics/../admin", ""},
		{"dot", "/./metrics", ""},
		{"query", "/metrics?name[]=x", ""},
		{"fragment", "/metrics#x", ""},
		{"escape", "/%2e%2e/admin", ""},
		{"backslash", `/metrics\..\admin`, ""},
		{"space", "/metrics x", ""},
		{"control", "/metrics\r\nHost: evil", ""},
		{"too long", "/" + strings.Repeat("a", maxMetricsPath), ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			meta := map[string]string{}
			if tc.path != "" {
				meta[MetaMetricsPath] = tc.path
			}
			p, m := poolOfOne(meta)
			if tc.want == "" {
				must.SliceEmpty(t, p.Workers("m"))
				must.Eq(t, 1.0, promtest.ToFloat64(m.MetaRejected.WithLabelValues(MetaMetricsPath)))
				return
			}
			ws := p.Workers("m")
			must.SliceLen(t, 1, ws)
			must.Eq(t, tc.want, ws[0].MetricsPath)
		})
	}
}

// Whatever a registration writes, an accepted path keeps the scrape on the
// engine's address, with that path and no query; a refused one is a
// MetaError naming the key.
func FuzzMetricsPath(f *testing.F) {
	for _, s := range []string{"/metrics", "/prometheus/metrics", "/metrics/", "@evil/x", "//evil", "/a/../b", "/m?x", "/%2e", "/./m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		meta := map[string]string{MetaMetricsPath: p}
		w := workerOf("i", "10.0.0.1:1", nil, func(k string) string { return meta[k] })
		if err := checkMetricsPath(w); err != nil {
			var me *MetaError
			must.True(t, errors.As(err, &me))
			must.Eq(t, MetaMetricsPath, me.Key)
			return
		}
		if p == "" {
			return
		}
		u, err := url.Parse("http://" + w.Address + w.MetricsPath)
		must.NoError(t, err)
		must.Eq(t, "10.0.0.1:1", u.Host)
		must.Eq(t, p, u.Path)
		must.Eq(t, "", u.RawQuery)
		must.Eq(t, "", u.Fragment)
		must.Nil(t, u.User)
		if p != "/" {
			must.Eq(t, strings.TrimSuffix(p, "/"), path.Clean(p))
		}
	})
}
