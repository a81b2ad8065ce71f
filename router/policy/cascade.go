package policy

import (
	"fmt"
	"math"
)

// Cascade gates.
const (
	// GateLogprob accepts the small model's answer when the mean log
	// probability of its sampled tokens is at least the threshold.
	GateLogprob = "logprob"
)

// Overflow triggers.
const (
	// OverflowQueueFull overflows a request local admission would refuse
	// (429 queue full, 503 queue timeout) or that no local engine can take.
	OverflowQueueFull = "queue_full"
	// OverflowTTFTOver overflows a request whose estimated time to first
	// token on the local pool (admission wait plus prefill queue) exceeds
	// ttft_seconds, and every request queue_full would overflow.
	OverflowTTFTOver = "ttft_over"
)

// Cascade sends requests for an alias to a small model first and to a large
// one when the small answer's confidence is below the threshold (the
// document's "cascades" map, keyed by alias).
type Cascade struct {
	Small string `json:"small"`
	Large string `json:"large"`
	// Gate is "logprob" (default): the mean token log probability.
	Gate string `json:"gate,omitempty"`
	// Threshold is the lowest mean token log probability accepted (≤ 0;
	// required: no default suits every pair of models).
	Threshold *float64 `json:"threshold"`
	// MaxSmallTokens caps the small model's answer (0: the client's
	// max_tokens only). An answer the cap cut short is escalated.
	MaxSmallTokens int `json:"max_small_tokens,omitempty"`
}

// Overflow sends a model's requests to another pool, typically a hosted
// OpenAI-compatible endpoint, when the local pool is saturated.
type Overflow struct {
	// Pool is the model name the overflow workers register under.
	Pool string `json:"pool"`
	// When is "queue_full" (default) or "ttft_over".
	When string `json:"when,omitempty"`
	// TTFTSeconds bounds the estimated time to first token (ttft_over only).
	TTFTSeconds float64 `json:"ttft_seconds,omitempty"`
	// Model is the name the overflow pool's API knows the model by
	// (default: Pool).
	Model string `json:"model,omitempty"`
}

// OverflowPolicy is a model's resolved overflow.
type OverflowPolicy struct {
	Pool, Model string
	TTFTOver    bool    // also overflow on the TTFT estimate
	TTFTSeconds float64 // the bound when TTFTOver
}

func (c Cascade) validate(where string, d *Document) error {
	switch {
	case c.Small == "":
		return fmt.Errorf("%s.small: required", where)
	case c.Large == "":
		return fmt.Errorf("%s.large: required", where)
	case c.Small == c.Large:
		return fmt.Errorf("%s.large: must differ from small (%q)", where, c.Small)
	case c.Gate != "" && c.Gate != GateLogprob:
		return fmt.Errorf("%s.gate: want %q, got %q", where, GateLogprob, c.Gate)
	case c.Threshold == nil:
		return fmt.Errorf("%s.threshold: required (a mean token log probability ≤ 0)", where)
	case math.IsNaN(*c.Threshold) || math.IsInf(*c.Threshold, 0) || *c.Threshold > 0:
		return fmt.Errorf("%s.threshold: want a mean token log probability ≤ 0, got %v", where, *c.Threshold)
	case c.MaxSmallTokens < 0:
		return fmt.Errorf("%s.max_small_tokens: must be ≥ 0 (0 = no cap), got %d", where, c.MaxSmallTokens)
	}
	for _, m := range []struct{ field, name string }{{"small", c.Small}, {"large", c.Large}} {
		if _, nested := d.Cascades[m.name]; nested {
			return fmt.Errorf("%s.%s: %q is itself a cascade alias; cascades do not nest", where, m.field, m.name)
		}
	}
	return nil
}

func (o *Overflow) validate(where, model string, d *Document) error {
	if o == nil {
		return nil
	}
	switch {
	case o.Pool == "":
		return fmt.Errorf("%s.pool: required", where)
	case o.Pool == model:
		return fmt.Errorf("%s.pool: must differ from the model itself", where)
	case o.When != "" && o.When != OverflowQueueFull && o.When != OverflowTTFTOver:
		return fmt.Errorf("%s.when: want %q or %q, got %q", where, OverflowQueueFull, OverflowTTFTOver, o.When)
	case o.When == OverflowTTFTOver && !(o.TTFTSeconds > 0) || math.IsInf(o.TTFTSeconds, 0):
		return fmt.Errorf("%s.ttft_seconds: want a number of seconds > 0 with when = %q, got %v", where, OverflowTTFTOver, o.TTFTSeconds)
	case o.When != OverflowTTFTOver && o.TTFTSeconds != 0:
		return fmt.Errorf("%s.ttft_seconds: only with when = %q", where, OverflowTTFTOver)
	}
	if m, ok := d.Models[o.Pool]; ok && m.Overflow != nil {
		return fmt.Errorf("%s.pool: %q overflows itself; overflow does not chain", where, o.Pool)
	}
	return nil
}

// OverflowFor resolves model's overflow; false when it has none. (Kept out
// of Resolved, which every request copies.)
func (d *Document) OverflowFor(model string) (OverflowPolicy, bool) {
	m, ok := d.Models[model]
	if !ok || m.Overflow == nil {
		return OverflowPolicy{}, false
	}
	o := m.Overflow
	p := OverflowPolicy{Pool: o.Pool, Model: o.Model, TTFTOver: o.When == OverflowTTFTOver, TTFTSeconds: o.TTFTSeconds}
	if p.Model == "" {
		p.Model = o.Pool
	}
	return p, true
}

// ThresholdValue is the threshold of a validated cascade.
func (c Cascade) ThresholdValue() float64 {
	if c.Threshold == nil {
		return 0
	}
	return *c.Threshold
}

// CascadeFor returns the cascade of alias; false when alias is none.
func (d *Document) CascadeFor(alias string) (Cascade, bool) {
	c, ok := d.Cascades[alias]
	return c, ok
}

// validateCascades checks the document's cascades and overflows.
func (d *Document) validateCascades() error {
	for alias, c := range d.Cascades {
		if alias == "" {
			return fmt.Errorf("cascades: empty alias")
		}
		if err := c.validate("cascades."+alias, d); err != nil {
			return err
		}
	}
	for name, m := range d.Models {
		if err := m.Overflow.validate("models."+name+".overflow", name, d); err != nil {
			return err
		}
	}
	return nil
}

// HostedPeersFor reports whether hosted workers of model compete with its
// local ones (hosted_peers, the model's over the document's).
func (d *Document) HostedPeersFor(model string) bool {
	if m, ok := d.Models[model]; ok && m.HostedPeers != nil {
		return *m.HostedPeers
	}
	return d.HostedPeers != nil && *d.HostedPeers
}
