// Package strategy is the Oasis strategy plugin for the Nomad Autoscaler
// ("oasis-sizing"): a check's query gives a model's arrival rate (requests/s),
// the check's strategy block gives the TTFT SLO, the headroom and the
// per-engine capacity, and autoscaler/sizing turns them into the engine
// count. cmd/oasis-autoscaler-strategy serves it over go-plugin; the
// autoscaler's agent config names it in a `strategy` block.
//
// The per-engine capacity is a number (requests/s one engine serves within
// the SLO, profiled) or "learned": then the check's prefill_seconds_query, a
// PromQL expression for a request's prefill time on one engine (the router's
// uncached prompt tokens per request over its learned prefill rate), is run
// against the Prometheus at the plugin's prometheus_address, and the rule
// derives the capacity from it and the SLO (sizing.Rule.LearnedCapacity).
package strategy

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/nomad-autoscaler/plugins/base"
	sdkstrategy "github.com/hashicorp/nomad-autoscaler/plugins/strategy"
	"github.com/hashicorp/nomad-autoscaler/sdk"

	"github.com/oasis-llm/oasis/autoscaler/sizing"
)

// Name is the strategy's name: the label of the autoscaler agent's
// `strategy` block and what the recipes' checks name.
const Name = "oasis-sizing"

// Driver is the plugin binary's name, the agent block's driver: the
// autoscaler refuses a plugin whose PluginInfo names anything else.
const Driver = "oasis-autoscaler-strategy"

// Check config keys beyond sizing's, and the plugin config's.
const (
	KeyPrefillQuery      = "prefill_seconds_query"
	KeyPrometheusAddress = "prometheus_address"
	// CapacityLearned is the capacity value that learns it from the prefill rate.
	CapacityLearned = "learned"
	// DefaultHeadroom is the headroom when a check does not set one (the
	// simulator's shipped figure, BENCHMARKS.md "Autoscaling on a diurnal trace").
	DefaultHeadroom = 0.08
	maxQueryLen     = 4096
)

// ErrNoMetric is returned when the check's query gave no value to size on.
var ErrNoMetric = errors.New("oasis-sizing: the check's query returned no value")

// PrefillQuerier runs an instant PromQL query for one number.
type PrefillQuerier interface {
	Query(ctx context.Context, query string) (float64, error)
}

// Config is the plugin's.
type Config struct {
	Logger hclog.Logger
	// Prometheus answers learned-capacity queries; nil builds one from the
	// plugin config's prometheus_address when a check needs it.
	Prometheus PrefillQuerier
	// QueryTimeout bounds a learned-capacity query (default 10 s).
	QueryTimeout time.Duration
}

// Plugin implements strategy.Strategy.
type Plugin struct {
	cfg Config

	mu   sync.Mutex
	prom PrefillQuerier
}

var _ sdkstrategy.Strategy = (*Plugin)(nil)

// New returns the plugin with defaults filled.
func New(cfg Config) *Plugin {
	if cfg.Logger == nil {
		cfg.Logger = hclog.NewNullLogger()
	}
	if cfg.QueryTimeout <= 0 {
		cfg.QueryTimeout = 10 * time.Second
	}
	return &Plugin{cfg: cfg, prom: cfg.Prometheus}
}

// PluginInfo implements base.Base.
func (p *Plugin) PluginInfo() (*base.PluginInfo, error) {
	return &base.PluginInfo{Name: Driver, PluginType: sdk.PluginTypeStrategy}, nil
}

// SetConfig implements base.Base: the agent's `strategy` block config. Only
// prometheus_address is read (the agent adds its own nomad_* keys).
func (p *Plugin) SetConfig(config map[string]string) error {
	addr := strings.TrimSpace(config[KeyPrometheusAddress])
	if addr == "" || p.cfg.Prometheus != nil {
		return nil
	}
	q, err := NewPrometheus(addr)
	if err != nil {
		return fmt.Errorf("oasis-sizing: %s: %w", KeyPrometheusAddress, err)
	}
	p.mu.Lock()
	p.prom = q
	p.mu.Unlock()
	return nil
}

// Run implements strategy.Strategy: the engine count for the latest value of
// the check's query.
func (p *Plugin) Run(eval *sdk.ScalingCheckEvaluation, count int64) (*sdk.ScalingCheckEvaluation, error) {
	if eval == nil || eval.Check == nil || eval.Check.Strategy == nil {
		return nil, errors.New("oasis-sizing: evaluation without a check strategy")
	}
	if eval.Action == nil {
		eval.Action = &sdk.ScalingAction{}
	}
	ch, err := ParseCheck(eval.Check.Strategy.Config)
	if err != nil {
		return nil, err
	}
	if len(eval.Metrics) == 0 {
		return nil, fmt.Errorf("check %q: %w (wrap it in `or vector(0)` to size an idle model)", eval.Check.Name, ErrNoMetric)
	}
	rate := eval.Metrics[len(eval.Metrics)-1].Value
	capacity := math.Inf(1) // no arrivals: min engines, whatever one serves
	if rate != 0 {
		if capacity, err = p.capacity(ch); err != nil {
			return nil, fmt.Errorf("check %q: %w", eval.Check.Name, err)
		}
	}
	n, err := ch.Rule.Engines(rate, capacity)
	if err != nil {
		return nil, fmt.Errorf("check %q: %w", eval.Check.Name, err)
	}
	p.cfg.Logger.Debug("sized", "check", eval.Check.Name, "rate", rate, "capacity", capacity, "count", count, "want", n)
	want := int64(n)
	switch {
	case want > count:
		eval.Action.Direction = sdk.ScaleDirectionUp
	case want < count:
		eval.Action.Direction = sdk.ScaleDirectionDown
	default:
		eval.Action.Direction = sdk.ScaleDirectionNone
		return eval, nil
	}
	eval.Action.Count = want
	eval.Action.Reason = fmt.Sprintf("%.3g req/s × %.2f ÷ %.3g req/s per engine = %d engines", rate, 1+ch.Rule.Headroom, capacity, n)
	return eval, nil
}

// capacity is the check's per-engine capacity: its number, or learned.
func (p *Plugin) capacity(ch Check) (float64, error) {
	if ch.Capacity > 0 {
		return ch.Capacity, nil
	}
	p.mu.Lock()
	prom := p.prom
	p.mu.Unlock()
	if prom == nil {
		return 0, fmt.Errorf("capacity %q needs %s in the plugin's config", CapacityLearned, KeyPrometheusAddress)
	}
	ctx, cancel := context.WithTimeout(context.Background(), p.cfg.QueryTimeout)
	defer cancel()
	s, err := prom.Query(ctx, ch.PrefillQuery)
	if err != nil {
		return 0, fmt.Errorf("%s: %w", KeyPrefillQuery, err)
	}
	return ch.Rule.LearnedCapacity(s)
}

// Check is one check's strategy config, parsed and validated.
type Check struct {
	Rule sizing.Rule
	// Capacity is requests/s per engine; 0 when learned (PrefillQuery set).
	Capacity     float64
	PrefillQuery string
}

// ParseCheck reads a check's strategy config; errors name the key.
func ParseCheck(cfg map[string]string) (Check, error) {
	var ch Check
	var err error
	ch.Rule.Headroom = DefaultHeadroom
	num := func(key string, dst *float64, required bool) {
		v, ok := cfg[key]
		if err != nil || (!ok && !required) {
			return
		}
		if !ok {
			err = &sizing.ConfigError{Key: key, Reason: "required"}
			return
		}
		f, perr := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if perr != nil || math.IsNaN(f) || math.IsInf(f, 0) {
			err = &sizing.ConfigError{Key: key, Reason: fmt.Sprintf("%q is not a number", v)}
			return
		}
		*dst = f
	}
	count := func(key string, dst *int) {
		v, ok := cfg[key]
		if err != nil || !ok {
			return
		}
		n, perr := strconv.Atoi(strings.TrimSpace(v))
		if perr != nil {
			err = &sizing.ConfigError{Key: key, Reason: fmt.Sprintf("%q is not a whole number", v)}
			return
		}
		*dst = n
	}
	num(sizing.KeySLO, &ch.Rule.SLO, true)
	num(sizing.KeyHeadroom, &ch.Rule.Headroom, false)
	num(sizing.KeyAttainment, &ch.Rule.Attainment, false)
	count(sizing.KeyMin, &ch.Rule.Min)
	count(sizing.KeyMax, &ch.Rule.Max)
	if err != nil {
		return Check{}, err
	}
	if err := ch.Rule.Validate(); err != nil {
		return Check{}, err
	}
	if err := ch.parseCapacity(cfg); err != nil {
		return Check{}, err
	}
	return ch, nil
}

func (ch *Check) parseCapacity(cfg map[string]string) error {
	v := strings.TrimSpace(cfg[sizing.KeyCapacity])
	if v == CapacityLearned {
		q := strings.TrimSpace(cfg[KeyPrefillQuery])
		if q == "" || len(q) > maxQueryLen {
			return &sizing.ConfigError{Key: KeyPrefillQuery, Reason: fmt.Sprintf("capacity %q needs a query of at most %d bytes", CapacityLearned, maxQueryLen)}
		}
		ch.PrefillQuery = q
		return nil
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || !(f > 0) || math.IsInf(f, 0) {
		return &sizing.ConfigError{Key: sizing.KeyCapacity, Reason: fmt.Sprintf("%q must be requests/s per engine (> 0) or %q", v, CapacityLearned)}
	}
	ch.Capacity = f
	return nil
}
