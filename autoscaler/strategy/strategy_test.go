package strategy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"github.com/hashicorp/nomad-autoscaler/plugins/base"
	sdkstrategy "github.com/hashicorp/nomad-autoscaler/plugins/strategy"
	"github.com/hashicorp/nomad-autoscaler/sdk"

	"github.com/oasis-llm/oasis/autoscaler/sizing"
)

func evalOf(cfg map[string]string, values ...float64) *sdk.ScalingCheckEvaluation {
	e := &sdk.ScalingCheckEvaluation{
		Check:  &sdk.ScalingPolicyCheck{Name: "demand", Strategy: &sdk.ScalingPolicyStrategy{Name: Name, Config: cfg}},
		Action: &sdk.ScalingAction{},
	}
	for i, v := range values {
		e.Metrics = append(e.Metrics, sdk.TimestampedMetric{Timestamp: time.Unix(int64(i), 0), Value: v})
	}
	return e
}

func TestRunSizesFromTheLatestRate(t *testing.T) {
	cfg := map[string]string{"ttft_slo_seconds": "2", "capacity": "2", "headroom": "0.1", "min": "1", "max": "8"}
	cases := []struct {
		name  string
		rates []float64
		count int64
		want  int64
		dir   sdk.ScaleDirection
	}{
		{"ramp: 7 req/s × 1.1 ÷ 2", []float64{1, 7}, 2, 4, sdk.ScaleDirectionUp},
		{"steady", []float64{7}, 4, 4, sdk.ScaleDirectionNone},
		{"trough", []float64{7, 0.5}, 4, 1, sdk.ScaleDirectionDown},
		{"idle: min", []float64{0}, 3, 1, sdk.ScaleDirectionDown},
		{"burst: max", []float64{100}, 3, 8, sdk.ScaleDirectionUp},
	}
	p := New(Config{})
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := p.Run(evalOf(cfg, tc.rates...), tc.count)
			if err != nil {
				t.Fatal(err)
			}
			if got.Action.Direction != tc.dir || (tc.dir != sdk.ScaleDirectionNone && got.Action.Count != tc.want) {
				t.Errorf("direction %s count %d, want %s %d", got.Action.Direction, got.Action.Count, tc.dir, tc.want)
			}
			// The plugin's answer is the rule's (the simulator's shipped fleet calls the same).
			ch, _ := ParseCheck(cfg)
			n, _ := ch.Rule.Engines(tc.rates[len(tc.rates)-1], ch.Capacity)
			if int64(n) != tc.want {
				t.Errorf("sizing.Rule.Engines = %d, plugin %d", n, tc.want)
			}
		})
	}
}

func TestParseCheckNamesTheKey(t *testing.T) {
	base := func(kv ...string) map[string]string {
		m := map[string]string{"ttft_slo_seconds": "1", "capacity": "3"}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "<unset>" {
				delete(m, kv[i])
				continue
			}
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		cfg map[string]string
		key string
	}{
		{base("ttft_slo_seconds", "<unset>"), sizing.KeySLO},
		{base("ttft_slo_seconds", "fast"), sizing.KeySLO},
		{base("ttft_slo_seconds", "-1"), sizing.KeySLO},
		{base("headroom", "NaN"), sizing.KeyHeadroom},
		{base("headroom", "-0.5"), sizing.KeyHeadroom},
		{base("attainment", "1.5"), sizing.KeyAttainment},
		{base("min", "1.5"), sizing.KeyMin},
		{base("max", "-2"), sizing.KeyMax},
		{base("min", "4", "max", "2"), sizing.KeyMax},
		{base("capacity", "<unset>"), sizing.KeyCapacity},
		{base("capacity", "0"), sizing.KeyCapacity},
		{base("capacity", "+Inf"), sizing.KeyCapacity},
		{base("capacity", "learned"), KeyPrefillQuery},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint(tc.cfg), func(t *testing.T) {
			_, err := ParseCheck(tc.cfg)
			var ce *sizing.ConfigError
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Errorf("error %v, want one naming %s", err, tc.key)
			}
		})
	}
	ch, err := ParseCheck(base())
	if err != nil || ch.Rule.Headroom != DefaultHeadroom || ch.Capacity != 3 {
		t.Errorf("defaults: %+v, %v", ch, err)
	}
}

type fixedQuerier struct {
	v     float64
	err   error
	query string
}

func (f *fixedQuerier) Query(_ context.Context, q string) (float64, error) {
	f.query = q
	return f.v, f.err
}

func TestRunLearnsCapacityFromThePrefillQuery(t *testing.T) {
	cfg := map[string]string{"ttft_slo_seconds": "2", "capacity": "learned", "prefill_seconds_query": "prefill_s", "headroom": "0"}
	q := &fixedQuerier{v: 0.25} // ρ = 1 − 0.25·ln(100)/2 ≈ 0.424: 1.70 req/s per engine
	got, err := New(Config{Prometheus: q}).Run(evalOf(cfg, 6), 1)
	if err != nil {
		t.Fatal(err)
	}
	if q.query != "prefill_s" || got.Action.Count != 4 { // 6 ÷ 1.70 → 4
		t.Errorf("query %q, count %d; want prefill_s, 4", q.query, got.Action.Count)
	}
	// A prefill as long as the SLO: no capacity, the check fails (the count stays).
	q.v = 1
	if _, err := New(Config{Prometheus: q}).Run(evalOf(cfg, 6), 1); !errors.Is(err, sizing.ErrSLOUnreachable) {
		t.Errorf("error %v, want ErrSLOUnreachable", err)
	}
	// Without prometheus_address the plugin says what is missing.
	if _, err := New(Config{}).Run(evalOf(cfg, 6), 1); err == nil {
		t.Error("learned capacity without a Prometheus: no error")
	}
}

func TestRunRefusesNoMetricAndBrokenValues(t *testing.T) {
	cfg := map[string]string{"ttft_slo_seconds": "2", "capacity": "2"}
	p := New(Config{})
	if _, err := p.Run(evalOf(cfg), 1); !errors.Is(err, ErrNoMetric) {
		t.Errorf("no metric: %v, want ErrNoMetric", err)
	}
	if _, err := p.Run(evalOf(cfg, -3), 1); !errors.Is(err, sizing.ErrNoSignal) {
		t.Errorf("negative rate: %v, want ErrNoSignal", err)
	}
	if _, err := p.Run(&sdk.ScalingCheckEvaluation{}, 1); err == nil {
		t.Error("evaluation without a check: no error")
	}
}

func TestPrometheusQuery(t *testing.T) {
	body := `{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":[1700000000,"0.25"]}]}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/query" || r.FormValue("query") != "q" {
			http.Error(w, "unexpected", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	}))
	defer srv.Close()
	p, err := NewPrometheus(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	if v, err := p.Query(context.Background(), "q"); err != nil || v != 0.25 {
		t.Errorf("Query = %v, %v; want 0.25", v, err)
	}
	body = `{"status":"success","data":{"resultType":"vector","result":[]}}`
	if _, err := p.Query(context.Background(), "q"); !errors.Is(err, ErrNotOneValue) {
		t.Errorf("empty vector: %v, want ErrNotOneValue", err)
	}
	if _, err := NewPrometheus("localhost:9090"); err == nil {
		t.Error("an address without a scheme: no error")
	}
	if err := New(Config{}).SetConfig(map[string]string{KeyPrometheusAddress: "ftp://x"}); err == nil {
		t.Error("SetConfig with a bad prometheus_address: no error")
	}
}

// TestServedOverGoPlugin runs the plugin behind go-plugin's gRPC transport, as the autoscaler
// talks to it: the strategy answers through the SDK's client.
func TestServedOverGoPlugin(t *testing.T) {
	impl := New(Config{})
	// What plugins.Serve registers for a strategy (cmd/oasis-autoscaler-strategy).
	client, _ := plugin.TestPluginGRPCConn(t, false, map[string]plugin.Plugin{
		sdk.PluginTypeStrategy: &sdkstrategy.PluginStrategy{Impl: impl},
		sdk.PluginTypeBase:     &base.PluginBase{Impl: impl},
	})
	defer client.Close()
	raw, err := client.Dispense(sdk.PluginTypeStrategy)
	if err != nil {
		t.Fatal(err)
	}
	s := raw.(sdkstrategy.Strategy)
	info, err := s.PluginInfo()
	if err != nil || info.Name != Driver {
		t.Fatalf("PluginInfo = %+v, %v", info, err)
	}
	got, err := s.Run(evalOf(map[string]string{"ttft_slo_seconds": "1", "capacity": "2"}, 5), 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Action.Count != 3 || got.Action.Direction != sdk.ScaleDirectionUp { // 5 × 1.08 (the default headroom) ÷ 2 → 3
		t.Errorf("over gRPC: %s %d, want up 3", got.Action.Direction, got.Action.Count)
	}
	_, err = s.Run(evalOf(map[string]string{"ttft_slo_seconds": "1", "capacity": "zero"}, 5), 1)
	if err == nil {
		t.Error("a bad config over gRPC: no error")
	}
}
