package policy

import (
	"fmt"
	"time"
)

// ScaleToZero lets a model run with no engine: a request for it that finds
// no healthy worker (and no other datacenter or overflow pool to serve it)
// is held until an engine joins the pool, while the autoscaler starts one on
// the router's held-requests signal, up to Hold; then it is routed as any
// other (gateway coldstart.go).
type ScaleToZero struct {
	// Hold bounds a request's wait for an engine (a Go duration, 1s–15m;
	// default DefaultColdStartHold). Past it the request is answered 503
	// with Retry-After. The client's own deadline, when shorter, wins.
	Hold *string `json:"hold,omitempty"`
	// MaxHeld bounds the requests one router holds for the model at once
	// (1–MaxColdStartHeld; default DefaultColdStartMaxHeld); one more is
	// answered 503 at once.
	MaxHeld *int `json:"max_held,omitempty"`
}

// Scale-to-zero bounds. A held request keeps its body (up to the router's
// -max-body-bytes) and a goroutine: MaxColdStartHeld bounds that memory per
// model whatever the document says.
const (
	DefaultColdStartHold    = 60 * time.Second
	DefaultColdStartMaxHeld = 64
	MinColdStartHold        = time.Second
	MaxColdStartHold        = 15 * time.Minute
	MaxColdStartHeld        = 4096
)

// ColdStartPolicy is a model's resolved scale_to_zero.
type ColdStartPolicy struct {
	Hold    time.Duration
	MaxHeld int
}

func (s *ScaleToZero) validate(where string) error {
	if s == nil {
		return nil
	}
	if s.Hold != nil {
		d, err := time.ParseDuration(*s.Hold)
		if err != nil || d < MinColdStartHold || d > MaxColdStartHold {
			return fmt.Errorf("%s.hold: want a duration from %s to %s like \"60s\", got %q", where, MinColdStartHold, MaxColdStartHold, *s.Hold)
		}
	}
	if s.MaxHeld != nil && (*s.MaxHeld < 1 || *s.MaxHeld > MaxColdStartHeld) {
		return fmt.Errorf("%s.max_held: want 1 to %d, got %d", where, MaxColdStartHeld, *s.MaxHeld)
	}
	return nil
}

// ColdStartFor resolves model's scale_to_zero; false when the model has
// none (a request finding no worker is refused at once). Kept out of
// Resolved, which every request copies.
func (d *Document) ColdStartFor(model string) (ColdStartPolicy, bool) {
	m, ok := d.Models[model]
	if !ok || m.ScaleToZero == nil {
		return ColdStartPolicy{}, false
	}
	p := ColdStartPolicy{Hold: DefaultColdStartHold, MaxHeld: DefaultColdStartMaxHeld}
	if h := m.ScaleToZero.Hold; h != nil {
		if v, err := time.ParseDuration(*h); err == nil {
			p.Hold = v
		}
	}
	if n := m.ScaleToZero.MaxHeld; n != nil {
		p.MaxHeld = *n
	}
	return p, true
}
