package discovery

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/router/metrics"
)

func TestDisaggMeta(t *testing.T) {
	cases := []struct {
		name      string
		meta      map[string]string
		proto     string
		bootstrap int
		refused   string // meta key, "" when accepted
	}{
		{"defaults", nil, "vllm", 0, ""},
		{"sglang engine", map[string]string{MetaEngine: "sglang"}, "sglang", 0, ""},
		{"explicit protocol", map[string]string{MetaEngine: "sglang", MetaPDProtocol: "vllm"}, "vllm", 0, ""},
		{"sglang prefill", map[string]string{MetaEngine: "sglang", MetaRole: "prefill", MetaBootstrapPort: "8998"}, "sglang", 8998, ""},
		{"unknown protocol", map[string]string{MetaPDProtocol: "nixl"}, "", 0, MetaPDProtocol},
		{"unknown role", map[string]string{MetaRole: "both-ways"}, "", 0, MetaRole},
		{"bad bootstrap port", map[string]string{MetaBootstrapPort: "99999"}, "", 0, MetaBootstrapPort},
		{"bootstrap port not a number", map[string]string{MetaBootstrapPort: "http"}, "", 0, MetaBootstrapPort},
		{"sglang prefill without bootstrap port", map[string]string{MetaEngine: "sglang", MetaRole: "prefill"}, "", 0, MetaBootstrapPort},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, m := poolOfOne(tc.meta)
			if tc.refused != "" {
				must.SliceEmpty(t, p.Workers("m"))
				must.Eq(t, 1.0, promtest.ToFloat64(m.MetaRejected.WithLabelValues(tc.refused)))
				return
			}
			ws := p.Workers("m")
			must.SliceLen(t, 1, ws)
			must.Eq(t, tc.proto, ws[0].PDProtocol)
			must.Eq(t, tc.bootstrap, ws[0].BootstrapPort)
		})
	}
}

// poolOfOne is a pool given, twice (a refusal is reported once), one instance
// of model "m" with meta added to oasis_model.
func poolOfOne(meta map[string]string) (*Pool, *metrics.Metrics) {
	m := metrics.New(prometheus.NewRegistry())
	p := New(Config{Metrics: m})
	all := map[string]string{MetaModel: "m"}
	for k, v := range meta {
		all[k] = v
	}
	in := []Instance{{ID: "i", Address: "10.0.0.1:8000", Meta: all}}
	p.Set(in)
	p.Set(in)
	return p, m
}
