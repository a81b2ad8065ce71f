package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestScalingCollectorExportsEachModelAndRole(t *testing.T) {
	cases := []struct {
		name    string
		samples []ScalingSample
		want    string
	}{
		{name: "no models", want: ""},
		{
			name: "disaggregated model: one queue wait, kv only where scraped",
			samples: []ScalingSample{
				{Model: "m", Role: "decode", Workers: 2, InFlight: 7, TTFTP90: 0.25, QueueWait: 1.5, KVUsage: 0.4, HasKV: true},
				{Model: "m", Role: "prefill", Workers: 1, InFlight: 3, TTFTP90: 2, QueueWait: 1.5},
			},
			want: `
# HELP oasis_router_scaling_in_flight Requests this router has in flight per model and role (sum over routers, divide by workers: in-flight per engine).
# TYPE oasis_router_scaling_in_flight gauge
oasis_router_scaling_in_flight{model="m",role="decode"} 7
oasis_router_scaling_in_flight{model="m",role="prefill"} 3
# HELP oasis_router_scaling_kv_usage Mean KV cache usage (0..1) of the role's workers, from their scraped engine metrics (absent when none were scraped).
# TYPE oasis_router_scaling_kv_usage gauge
oasis_router_scaling_kv_usage{model="m",role="decode"} 0.4
# HELP oasis_router_scaling_queue_wait_seconds Estimated wait for an admission slot of the model (requests ahead times the mean request time over max_in_flight; 0 when uncapped or a slot is free).
# TYPE oasis_router_scaling_queue_wait_seconds gauge
oasis_router_scaling_queue_wait_seconds{model="m"} 1.5
# HELP oasis_router_scaling_workers Routable workers per model and role in this router's view (divide by it for per-engine figures).
# TYPE oasis_router_scaling_workers gauge
oasis_router_scaling_workers{model="m",role="decode"} 2
oasis_router_scaling_workers{model="m",role="prefill"} 1
`,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := NewScalingCollector(func() []ScalingSample { return tc.samples })
			reg := prometheus.NewPedanticRegistry()
			if err := reg.Register(c); err != nil {
				t.Fatal(err)
			}
			err := testutil.GatherAndCompare(reg, strings.NewReader(tc.want),
				"oasis_router_scaling_in_flight", "oasis_router_scaling_kv_usage",
				"oasis_router_scaling_queue_wait_seconds", "oasis_router_scaling_workers")
			if err != nil {
				t.Fatal(err)
			}
			for _, name := range []string{"oasis_router_scaling_estimated_ttft_p90_seconds", "oasis_router_scaling_estimated_ttft_p50_seconds",
				"oasis_router_scaling_prefill_tokens_per_second"} {
				if n := testutil.CollectAndCount(c, name); n != len(tc.samples) {
					t.Fatalf("%s: %d series, want %d", name, n, len(tc.samples))
				}
			}
		})
	}
}
