// Package sizing is the engine-count rule of Oasis's autoscaling: the number
// of engines a model (or one role of a disaggregated model) needs is its
// arrival rate, raised by a headroom, over the request rate one engine serves
// within the TTFT SLO:
//
//	engines = ⌈rate × (1 + headroom) ÷ capacity⌉, clamped to [min, max]
//
// The per-engine capacity is either profiled (requests/s one engine served
// within the SLO, as Dynamo's planner profiles it) or derived from the
// router's learned prefill rate: a request's prefill takes S seconds (its
// uncached prompt tokens over the tokens/s the router learned), and an engine
// loaded to ρ keeps the share of requests waiting past the SLO under
// 1 − attainment when, treating it as an M/M/1 queue whose time in system is
// exponential with mean S/(1−ρ), exp(−(1−ρ)·SLO/S) ≤ 1 − attainment, that is
// ρ ≤ 1 − S·ln(1/(1−attainment))/SLO; capacity = ρ/S.
//
// The Nomad Autoscaler strategy plugin (autoscaler/strategy,
// cmd/oasis-autoscaler-strategy) and the cluster simulator's shipped fleet
// (bench/cluster.RuleScaler, `make bench-autoscale`) both call it, so the
// benchmark measures the rule users run.
package sizing

import (
	"errors"
	"fmt"
	"math"
)

// Config keys, as the strategy plugin's check config names them; a
// ConfigError carries one.
const (
	KeySLO        = "ttft_slo_seconds"
	KeyHeadroom   = "headroom"
	KeyAttainment = "attainment"
	KeyCapacity   = "capacity"
	KeyMin        = "min"
	KeyMax        = "max"
)

// Bounds on the rule's inputs: beyond them a value is a mistake, not a policy.
const (
	MaxSLO      = 3600.0 // seconds
	MaxHeadroom = 10.0   // +1,000%
	MaxEngines  = 100000
	// DefaultAttainment is the share of requests the learned capacity keeps
	// within the SLO when the config does not say.
	DefaultAttainment = 0.99
)

// ErrSLOUnreachable is returned when one request's prefill alone takes as long
// as the SLO allows: no engine load meets it, so no capacity can be learned.
var ErrSLOUnreachable = errors.New("sizing: a request's prefill alone reaches the TTFT SLO")

// ErrNoSignal is returned for a rate or prefill time that is negative, NaN or
// infinite: a broken query, not a load.
var ErrNoSignal = errors.New("sizing: signal is not a finite, non-negative number")

// ConfigError names the config key whose value is refused.
type ConfigError struct {
	Key    string
	Reason string
}

func (e *ConfigError) Error() string { return fmt.Sprintf("sizing: %s: %s", e.Key, e.Reason) }

// Rule is the sizing rule's policy. The zero Attainment means
// DefaultAttainment; Max 0 means no upper bound of its own (the scaling
// block's max still applies).
type Rule struct {
	SLO        float64 // TTFT SLO, seconds
	Headroom   float64 // rate raised by this fraction: 0.1 sizes for 10% more than measured
	Attainment float64 // share of requests within the SLO the learned capacity aims for, (0, 1)
	Min, Max   int     // engines
}

// Validate checks every field and names the first bad one's config key.
func (r Rule) Validate() error {
	switch {
	case !(r.SLO > 0 && r.SLO <= MaxSLO):
		return &ConfigError{KeySLO, fmt.Sprintf("%v must be in (0, %v] seconds", r.SLO, MaxSLO)}
	case !(r.Headroom >= 0 && r.Headroom <= MaxHeadroom):
		return &ConfigError{KeyHeadroom, fmt.Sprintf("%v must be in [0, %v]", r.Headroom, MaxHeadroom)}
	case !(r.Attainment >= 0 && r.Attainment < 1):
		return &ConfigError{KeyAttainment, fmt.Sprintf("%v must be in (0, 1)", r.Attainment)}
	case r.Min < 0 || r.Min > MaxEngines:
		return &ConfigError{KeyMin, fmt.Sprintf("%d must be in [0, %d]", r.Min, MaxEngines)}
	case r.Max < 0 || r.Max > MaxEngines:
		return &ConfigError{KeyMax, fmt.Sprintf("%d must be in [0, %d]", r.Max, MaxEngines)}
	case r.Max > 0 && r.Max < r.Min:
		return &ConfigError{KeyMax, fmt.Sprintf("%d is below min %d", r.Max, r.Min)}
	}
	return nil
}

func (r Rule) attainment() float64 {
	if r.Attainment == 0 {
		return DefaultAttainment
	}
	return r.Attainment
}

// LearnedCapacity is the request rate one engine serves within the SLO when
// a request's prefill takes prefillSeconds: ρ/S with ρ = 1 − S·ln(1/(1−a))/SLO.
func (r Rule) LearnedCapacity(prefillSeconds float64) (float64, error) {
	if !finite(prefillSeconds) {
		return 0, fmt.Errorf("prefill seconds %v: %w", prefillSeconds, ErrNoSignal)
	}
	if prefillSeconds == 0 {
		return math.Inf(1), nil // nothing to prefill: prefill bounds nothing
	}
	rho := 1 - prefillSeconds*math.Log(1/(1-r.attainment()))/r.SLO
	if rho <= 0 {
		return 0, fmt.Errorf("prefill %.3g s per request, SLO %.3g s: %w", prefillSeconds, r.SLO, ErrSLOUnreachable)
	}
	return rho / prefillSeconds, nil
}

// Engines is the engine count for an arrival rate (requests/s) at a per-engine
// capacity (requests/s), clamped to [Min, Max]. A zero rate gives Min.
func (r Rule) Engines(rate, capacity float64) (int, error) {
	if !finite(rate) {
		return 0, fmt.Errorf("arrival rate %v: %w", rate, ErrNoSignal)
	}
	if !(capacity > 0) || math.IsNaN(capacity) {
		return 0, fmt.Errorf("capacity %v: %w", capacity, ErrNoSignal)
	}
	want := math.Ceil(rate * (1 + r.Headroom) / capacity)
	n := MaxEngines
	if want < MaxEngines {
		n = int(want)
	}
	n = max(n, r.Min)
	if r.Max > 0 {
		n = min(n, r.Max)
	}
	return n, nil
}

func finite(x float64) bool { return x >= 0 && !math.IsInf(x, 0) && !math.IsNaN(x) }
