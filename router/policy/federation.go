package policy

import (
	"fmt"
	"math"
	"time"
)

// Federation is the document's "federation" section: whether and when this
// router sends requests to another datacenter's router (router/federation).
// Off unless enabled; an omitted field takes its default.
//
//	"federation": {
//	  "enabled": true,
//	  "margin": "50ms",
//	  "queue_wait_budget": "500ms",
//	  "max_spill_fraction": 0.5,
//	  "resume_spill_fraction": 0.4,
//	  "breaker_failures": 5,
//	  "breaker_cooldown": "10s",
//	  "summary_stale": "3s"
//	}
type Federation struct {
	Enabled *bool `json:"enabled,omitempty"`
	// Margin is what a remote datacenter's estimated saving must exceed its
	// extra cost by before a request the local datacenter can serve leaves.
	Margin *string `json:"margin,omitempty"`
	// QueueWaitBudget: a local admission wait estimated above it counts as
	// saturation.
	QueueWaitBudget *string `json:"queue_wait_budget,omitempty"`
	// MaxSpillFraction caps the share of a window's requests sent away; past
	// it spilling pauses until the share falls to ResumeSpillFraction.
	MaxSpillFraction    *float64 `json:"max_spill_fraction,omitempty"`
	ResumeSpillFraction *float64 `json:"resume_spill_fraction,omitempty"`
	// BreakerFailures consecutive failures open a datacenter's breaker for
	// BreakerCooldown, after which one request probes it.
	BreakerFailures *int    `json:"breaker_failures,omitempty"`
	BreakerCooldown *string `json:"breaker_cooldown,omitempty"`
	// SummaryStale is the age after which a datacenter's summary is ignored.
	SummaryStale *string `json:"summary_stale,omitempty"`
}

// FederationSettings are the resolved federation section.
type FederationSettings struct {
	Enabled             bool
	Margin              time.Duration
	QueueWaitBudget     time.Duration
	MaxSpillFraction    float64
	ResumeSpillFraction float64
	BreakerFailures     int
	BreakerCooldown     time.Duration
	SummaryStale        time.Duration
}

// DefaultFederation is the section's defaults (federation off).
func DefaultFederation() FederationSettings {
	return FederationSettings{Margin: 50 * time.Millisecond, QueueWaitBudget: 500 * time.Millisecond,
		MaxSpillFraction: 0.5, ResumeSpillFraction: 0.4, BreakerFailures: 5,
		BreakerCooldown: 10 * time.Second, SummaryStale: 3 * time.Second}
}

// FederationSettings resolves the document's federation section.
func (d *Document) FederationSettings() FederationSettings {
	s := DefaultFederation()
	f := d.Federation
	if f == nil {
		return s
	}
	if f.Enabled != nil {
		s.Enabled = *f.Enabled
	}
	for _, p := range []struct {
		v   *string
		dst *time.Duration
	}{{f.Margin, &s.Margin}, {f.QueueWaitBudget, &s.QueueWaitBudget},
		{f.BreakerCooldown, &s.BreakerCooldown}, {f.SummaryStale, &s.SummaryStale}} {
		if p.v != nil {
			if d, err := time.ParseDuration(*p.v); err == nil {
				*p.dst = d
			}
		}
	}
	if f.MaxSpillFraction != nil {
		s.MaxSpillFraction = *f.MaxSpillFraction
	}
	if f.ResumeSpillFraction != nil {
		s.ResumeSpillFraction = *f.ResumeSpillFraction
	}
	if f.BreakerFailures != nil {
		s.BreakerFailures = *f.BreakerFailures
	}
	return s
}

func (f *Federation) validate() error {
	if f == nil {
		return nil
	}
	for _, p := range []struct {
		name string
		v    *string
		min  time.Duration
	}{{"margin", f.Margin, 0}, {"queue_wait_budget", f.QueueWaitBudget, 0},
		{"breaker_cooldown", f.BreakerCooldown, time.Millisecond}, {"summary_stale", f.SummaryStale, time.Millisecond}} {
		if p.v == nil {
			continue
		}
		if d, err := time.ParseDuration(*p.v); err != nil || d < p.min {
			return fmt.Errorf("federation.%s: want a duration ≥ %v like \"2s\", got %q", p.name, p.min, *p.v)
		}
	}
	for _, p := range []struct {
		name string
		v    *float64
	}{{"max_spill_fraction", f.MaxSpillFraction}, {"resume_spill_fraction", f.ResumeSpillFraction}} {
		if p.v != nil && (math.IsNaN(*p.v) || *p.v < 0 || *p.v > 1) {
			return fmt.Errorf("federation.%s: want a fraction in [0, 1], got %v", p.name, *p.v)
		}
	}
	s := (&Document{Federation: f}).FederationSettings()
	if s.ResumeSpillFraction > s.MaxSpillFraction {
		return fmt.Errorf("federation.resume_spill_fraction (%v) must not exceed max_spill_fraction (%v)",
			s.ResumeSpillFraction, s.MaxSpillFraction)
	}
	if f.BreakerFailures != nil && (*f.BreakerFailures < 1 || *f.BreakerFailures > 1000) {
		return fmt.Errorf("federation.breaker_failures: want 1 to 1000, got %d", *f.BreakerFailures)
	}
	return nil
}
