package cluster

import (
	"math"
	"time"
)

// StaticScaler keeps N engines: the fleet sized for the peak.
type StaticScaler struct{ N int }

// Decide implements Scaler.
func (s StaticScaler) Decide(*History) int { return s.N }

// ThresholdScaler is the policy the recipes ship (recipes/*/README.md
// "Autoscaling"), evaluated as the Nomad Autoscaler evaluates it: every
// EvalInterval, over the samples of each check's window, a check fires when
// at least Trigger samples are in its bounds (the threshold strategy's
// within_bounds_trigger); any scale-out check wins over the idle check;
// after a scale-out nothing is evaluated for CooldownOut, after a scale-in
// for CooldownIn; nothing is evaluated while an engine is still starting
// (the Nomad target reports the job not ready during its deployment).
type ThresholdScaler struct {
	SLO            float64 // TTFT SLO, s: out when the estimated TTFT reaches TTFTFactor of it
	TTFTFactor     float64
	TTFTP90        bool    // the check reads the p90 over engines instead of the median
	TargetInFlight float64 // in-flight per engine: out at it, in when one fewer would stay under half
	EvalInterval   time.Duration
	Window         time.Duration // the scale-out checks' query_window
	Trigger        int           // their within_bounds_trigger
	IdleWindow     time.Duration // the idle check's window; it needs all of it
	CooldownOut    time.Duration // cooldown_on_scale_up
	CooldownIn     time.Duration // cooldown
	OutPercent     float64       // growth of a scale-out, % (ceil)

	lastEval, quietUntil time.Duration
}

// ShippedScaler is ThresholdScaler with the GPU recipes' defaults for an SLO.
func ShippedScaler(slo float64, targetInFlight float64) *ThresholdScaler {
	return &ThresholdScaler{SLO: slo, TTFTFactor: 0.5, TargetInFlight: targetInFlight, EvalInterval: 10 * time.Second,
		Window: 30 * time.Second, Trigger: 5, IdleWindow: 5 * time.Minute,
		CooldownOut: 2 * time.Minute, CooldownIn: time.Minute, OutPercent: 50}
}

// Decide implements Scaler.
func (t *ThresholdScaler) Decide(h *History) int {
	now := h.Last()
	if now.At-t.lastEval < t.EvalInterval || now.At < t.quietUntil || now.Engines != now.Serving {
		return now.Engines
	}
	t.lastEval = now.At
	hot := 0
	for _, s := range h.Window(t.Window) {
		ttft := s.TTFTP50
		if t.TTFTP90 {
			ttft = s.TTFTP90
		}
		if ttft >= t.SLO*t.TTFTFactor || perEngine(s.InFlight, s.Serving) >= t.TargetInFlight {
			hot++
		}
	}
	if hot >= t.Trigger {
		t.quietUntil = now.At + t.CooldownOut
		return int(math.Ceil(float64(now.Engines) * (1 + t.OutPercent/100)))
	}
	idle := h.Window(t.IdleWindow)
	if now.At < t.IdleWindow || len(idle) == 0 {
		return now.Engines
	}
	for _, s := range idle {
		if perEngine(s.InFlight, s.Serving-1) >= t.TargetInFlight*0.5 {
			return now.Engines
		}
	}
	t.quietUntil = now.At + t.CooldownIn
	return now.Engines - 1
}

func perEngine(inFlight int64, engines int) float64 {
	return float64(inFlight) / float64(max(engines, 1))
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
