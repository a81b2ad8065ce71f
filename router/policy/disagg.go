package policy

import (
	"fmt"
	"math"
)

// Disaggregation modes.
const (
	DisaggAuto = "auto" // pair a prefill and a decode worker when the model has both
	DisaggOff  = "off"  // never: prefill workers get no requests
)

// Fallbacks when every prefill leg failed.
const (
	FallbackLocal = "local" // serve without a remote prefill (aggregated or decode worker)
	FallbackNone  = "none"  // answer the client with the prefill leg's error
)

// DefaultDisaggMinUncachedTokens is the threshold below which a prompt goes
// straight to a decode worker: prefilling a few hundred tokens inside a
// decode batch costs that worker milliseconds, less than a second request
// and a KV transfer. (Dynamo's disaggregated router compares the uncached
// prompt length with max_local_prefill_length, llm-d's P/D profile handler
// with its non-cached-tokens threshold, the same way.)
const DefaultDisaggMinUncachedTokens = 256

// Disagg is the disaggregated prefill/decode policy, document-wide and per
// model (embedded: its fields sit next to the others in JSON). An omitted
// field inherits.
type Disagg struct {
	// Disaggregation is "auto" (default) or "off".
	Disaggregation *string `json:"disaggregation,omitempty"`
	// DisaggregationMinUncachedTokens: prompts with fewer uncached tokens on
	// the chosen decode worker are sent to it directly.
	DisaggregationMinUncachedTokens *int `json:"disaggregation_min_uncached_tokens,omitempty"`
	// DisaggregationFallback is "local" (default) or "none".
	DisaggregationFallback *string `json:"disaggregation_fallback,omitempty"`
}

// DisaggPolicy is the resolved disaggregation policy of one model. (8
// bytes: it is copied into every request's state.)
type DisaggPolicy struct {
	MinUncachedTokens int32
	Enabled           bool
	Fallback          bool // serve without a remote prefill when every prefill leg failed
}

func (d Disagg) validate(where string) error {
	if v := d.Disaggregation; v != nil && *v != DisaggAuto && *v != DisaggOff {
		return fmt.Errorf("%sdisaggregation: want %q or %q, got %q", where, DisaggAuto, DisaggOff, *v)
	}
	if v := d.DisaggregationMinUncachedTokens; v != nil && (*v < 0 || *v > math.MaxInt32) {
		return fmt.Errorf("%sdisaggregation_min_uncached_tokens: must be between 0 and %d, got %d", where, math.MaxInt32, *v)
	}
	if v := d.DisaggregationFallback; v != nil && *v != FallbackLocal && *v != FallbackNone {
		return fmt.Errorf("%sdisaggregation_fallback: want %q or %q, got %q", where, FallbackLocal, FallbackNone, *v)
	}
	return nil
}

func (d Disagg) apply(p DisaggPolicy) DisaggPolicy {
	if d.Disaggregation != nil {
		p.Enabled = *d.Disaggregation == DisaggAuto
	}
	if d.DisaggregationMinUncachedTokens != nil {
		p.MinUncachedTokens = int32(min(max(*d.DisaggregationMinUncachedTokens, 0), math.MaxInt32))
	}
	if d.DisaggregationFallback != nil {
		p.Fallback = *d.DisaggregationFallback == FallbackLocal
	}
	return p
}

func (d Disagg) empty() bool {
	return d.Disaggregation == nil && d.DisaggregationMinUncachedTokens == nil && d.DisaggregationFallback == nil
}
