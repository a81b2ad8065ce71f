package cluster

import (
	"math"
	"time"

	"github.com/oasis-llm/oasis/autoscaler/sizing"
)

// StaticScaler keeps N engines: the fleet sized for the peak.
type StaticScaler struct{ N int }

// Decide implements Scaler.
func (s StaticScaler) Decide(*History) int { return s.N }

// RuleScaler is the policy the recipes ship: the Oasis strategy plugin
// (cmd/oasis-autoscaler-strategy) sizing the fleet with autoscaler/sizing,
// evaluated as the Nomad Autoscaler runs it: every EvalInterval the arrival
// rate over the last Window (the check's query, a rate() over it) goes
// through sizing.Rule.Engines; after a scale-out nothing is evaluated for
// CooldownOut, after a scale-in for CooldownIn, nor while an engine is still
// starting (the Nomad target reports the job not ready during its
// deployment). Capacity is the profiled requests/s per engine; 0 learns it
// from the engines' prefill (sizing.Rule.LearnedCapacity: the window's
// uncached prompt tokens per arrival over the median learned prefill rate).
type RuleScaler struct {
	Rule                    sizing.Rule
	Capacity                float64
	EvalInterval, Window    time.Duration
	CooldownOut, CooldownIn time.Duration

	lastEval, quietUntil time.Duration
}

// Decide implements Scaler.
func (r *RuleScaler) Decide(h *History) int {
	now := h.Last()
	if now.At-r.lastEval < r.EvalInterval || now.At < r.quietUntil || now.Engines != now.Serving {
		return now.Engines
	}
	r.lastEval = now.At
	rate, prefillSeconds := windowSignals(h.Window(r.Window), r.Window)
	capacity := r.Capacity
	if capacity <= 0 {
		c, err := r.Rule.LearnedCapacity(prefillSeconds)
		if err != nil {
			return now.Engines // the autoscaler logs the check's error and leaves the count
		}
		capacity = c
	}
	n, err := r.Rule.Engines(rate, capacity)
	switch {
	case err != nil:
		return now.Engines
	case n > now.Engines:
		r.quietUntil = now.At + r.CooldownOut
	case n < now.Engines:
		r.quietUntil = now.At + r.CooldownIn
	}
	return n
}

// windowSignals is the arrival rate over a window of d and a request's
// prefill time: uncached prompt tokens per arrival over the latest median
// learned prefill rate (0 without arrivals).
func windowSignals(w []Sample, d time.Duration) (rate, prefillSeconds float64) {
	var arrivals, tokens int64
	for _, s := range w {
		arrivals += int64(s.Arrivals)
		tokens += s.PrefillTokens
	}
	rate = float64(arrivals) / d.Seconds()
	if arrivals > 0 && len(w) > 0 && w[len(w)-1].PrefillRate > 0 {
		prefillSeconds = float64(tokens) / float64(arrivals) / w[len(w)-1].PrefillRate
	}
	return rate, prefillSeconds
}

// PlannerScaler restates NVIDIA Dynamo Planner's SLA-based approach
// (components/planner, "SLA-based planner" in its documentation; none of its
// code is used): every AdjustInterval it predicts the next interval's
// request rate from the last (its constant load predictor) and runs
// ceil(rate / capacity) engines, where capacity is the request rate one
// engine sustains within the SLA, profiled beforehand (its profile_sla
// step). It scales both ways at once, without cooldowns.
type PlannerScaler struct {
	Capacity       float64 // requests/s one engine serves within the SLO
	AdjustInterval time.Duration
	// Headroom multiplies the predicted rate (0 or 1: none, as Dynamo's
	// planner): room for the rise during an engine's cold start.
	Headroom float64

	last time.Duration
	want int
}

// Decide implements Scaler.
func (p *PlannerScaler) Decide(h *History) int {
	now := h.Last()
	if p.want == 0 {
		p.want = now.Engines
	}
	if now.At-p.last < p.AdjustInterval {
		return p.want
	}
	p.last = now.At
	arrivals := 0
	for _, s := range h.Window(p.AdjustInterval) {
		arrivals += s.Arrivals
	}
	rate := float64(arrivals) / p.AdjustInterval.Seconds() * max(p.Headroom, 1)
	p.want = max(1, int(math.Ceil(rate/p.Capacity)))
	return p.want
}
