// Package policy reads, validates and watches the router's policy document in
// Consul KV (default key oasis/router/policy).
package policy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/oasis-llm/oasis/router/scoring"
)

// Document is the policy as stored in Consul KV, JSON:
//
//	{
//	  "policy": "weighted",
//	  "weights": {"ttft": 2, "prefix": 1, "load": 0.2, "power": 1.3},
//	  "admission": {"max_in_flight": 256, "max_queue": 512, "queue_timeout": "10s"},
//	  "timeouts": {"response_header": "5m", "stream_idle": "60s", "first_token_hold": "auto"},
//	  "migration_limit": 2,
//	  "models": {
//	    "llama-3-8b": {"policy": "least_load", "admission": {"max_in_flight": 64}},
//	    "qwen3-8b": {"scale_to_zero": {"hold": "90s", "max_held": 64}}
//	  }
//	}
//
// Per-model entries override only the fields they set.
type Document struct {
	Policy    string             `json:"policy"`
	Weights   map[string]float64 `json:"weights,omitempty"`
	Admission Admission          `json:"admission"`
	Timeouts  *Timeouts          `json:"timeouts,omitempty"`
	Models    map[string]Model   `json:"models,omitempty"`
	// Disaggregated prefill/decode: see disagg.go.
	Disagg
	// Federation is document-wide: see federation.go.
	Federation *Federation `json:"federation,omitempty"`
	// Cascades maps a model alias to its small → large cascade (cascade.go).
	Cascades map[string]Cascade `json:"cascades,omitempty"`
	// HostedPeers makes hosted workers (oasis_upstream) candidates beside
	// local ones; by default they serve a model only when no local worker
	// does, or as an overflow pool. A model's hosted_peers overrides it.
	HostedPeers *bool `json:"hosted_peers,omitempty"`
	// MigrationLimit bounds how many times one stream whose engine fails
	// after its first token is continued on another engine (gateway
	// migrate.go); 0 turns migration off. Default DefaultMigrationLimit.
	MigrationLimit *int `json:"migration_limit,omitempty"`
}

// Model overrides the document's defaults for one model.
type Model struct {
	Policy    string             `json:"policy,omitempty"`
	Weights   map[string]float64 `json:"weights,omitempty"`
	Admission *Admission         `json:"admission,omitempty"`
	Timeouts  *Timeouts          `json:"timeouts,omitempty"`
	Disagg
	// Overflow sends requests the local pool cannot take in time to
	// another pool (cascade.go).
	Overflow       *Overflow `json:"overflow,omitempty"`
	HostedPeers    *bool     `json:"hosted_peers,omitempty"`
	MigrationLimit *int      `json:"migration_limit,omitempty"`
	// ScaleToZero holds requests while the model has no engine, until the
	// autoscaler starts one (scaletozero.go).
	ScaleToZero *ScaleToZero `json:"scale_to_zero,omitempty"`
}

// Timeouts bound the router's wait for an engine. In a per-model override an
// omitted field inherits the default.
type Timeouts struct {
	// ResponseHeader bounds the wait for the engine's response head after the
	// request is sent. A non-streaming answer's head comes only when the whole
	// answer is generated, so it must cover the longest generation.
	ResponseHeader *string `json:"response_header,omitempty"`
	// StreamIdle bounds the wait between two reads of a streamed answer (the
	// engine's role chunk and the first token included).
	StreamIdle *string `json:"stream_idle,omitempty"`
	// FirstTokenHold bounds how long a stream's head and role-only first chunk
	// are held back from the client waiting for the first token; a failure
	// while they are held is retried on another worker. "auto": twice the
	// model's observed time-to-first-token p99, at most 30 s; "0s": no hold.
	FirstTokenHold *string `json:"first_token_hold,omitempty"`
}

// Admission caps concurrency per model. Zero MaxInFlight means unlimited.
// In a per-model override an omitted field inherits the default.
type Admission struct {
	MaxInFlight  *int    `json:"max_in_flight,omitempty"`
	MaxQueue     *int    `json:"max_queue,omitempty"`
	QueueTimeout *string `json:"queue_timeout,omitempty"` // Go duration, e.g. "10s"
}

// Limits are resolved admission settings.
type Limits struct {
	MaxInFlight  int           // 0: unlimited
	MaxQueue     int           // requests that may wait for a slot; beyond → 429
	QueueTimeout time.Duration // longest wait for a slot; beyond → 503
}

// UpstreamTimeouts are resolved timeouts.
type UpstreamTimeouts struct {
	ResponseHeader time.Duration
	StreamIdle     time.Duration
	// FirstTokenHold is the fixed hold; HoldAuto says the router derives it
	// from the model's observed time to first token instead.
	FirstTokenHold time.Duration
	HoldAuto       bool
}

// Default timeouts: a generation of a few thousand tokens at tens of tokens
// per second fits in the response-header timeout; a minute without an event
// is no engine's normal pace.
const (
	DefaultResponseHeaderTimeout = 5 * time.Minute
	DefaultStreamIdleTimeout     = 60 * time.Second
)

// Resolved is the policy that applies to one model.
type Resolved struct {
	Scoring  scoring.Config
	Limits   Limits
	Timeouts UpstreamTimeouts
	Disagg   DisaggPolicy
	// MigrationLimit: continuations of one stream on another engine.
	MigrationLimit int
}

// DefaultMigrationLimit continues a stream up to twice: one engine failure
// is the common case (a crash, a node drained past its deadline), a second
// covers a rolling update that replaces the engine the stream moved to.
// Each continuation re-prefills the prompt and what was generated where
// the new engine does not hold them, so more is rarely worth it.
const DefaultMigrationLimit = 2

// maxMigrationLimit bounds migration_limit.
const maxMigrationLimit = 16

// DefaultWeights are the weighted policy's terms when no document says otherwise. Estimated
// time to first token weighs most: a long uncached prompt goes to a fast worker with no prompts
// queued, or to one holding its prefix. Among workers that would answer about as soon, KV-cache
// affinity and power decide: power prefers the placement with the most tokens per joule, which
// is a worker already decoding (a request joining a batch shares its steps) on an efficient GPU,
// so load consolidates onto fewer GPUs instead of spreading one or two sequences over each; a
// little load keeps that from piling up where prompt tokens are unknown (ttft neutral). The
// prefix term's hot-spot guard keeps one shared system prompt from piling load on its holder,
// and the ttft term's recompute charge (scoring.DefaultRecompute) keeps a session or tenant on
// the worker holding its prefix until that worker's queue costs more than the recompute
// elsewhere. The routing benchmark (bench/cluster) measures exactly these, cross-validated
// across its trace library (router/README.md says how they were chosen).
func DefaultWeights() map[string]float64 {
	return map[string]float64{"ttft": 2, "prefix": 1, "load": 0.2, "power": 1.3}
}

// Default is the document the router writes when none exists.
func Default() *Document {
	inflight, queue, timeout := 0, 1024, "30s"
	return &Document{
		Policy:    scoring.Weighted,
		Weights:   DefaultWeights(),
		Admission: Admission{MaxInFlight: &inflight, MaxQueue: &queue, QueueTimeout: &timeout},
	}
}

// Parse decodes and validates a document, JSON (first non-space byte '{') or
// HCL. Unknown fields are errors so a typo never silently falls back to a
// default.
func Parse(data []byte, reg *scoring.Registry) (*Document, error) {
	if t := bytes.TrimSpace(data); len(t) > 0 && t[0] != '{' {
		d, err := decodeHCL(data)
		if err != nil {
			return nil, err
		}
		if err := d.Validate(reg); err != nil {
			return nil, err
		}
		return d, nil
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var d Document
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("decoding policy JSON: %w", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("decoding policy JSON: data after the document")
	}
	if err := d.Validate(reg); err != nil {
		return nil, err
	}
	return &d, nil
}

// Validate checks every field, naming the first bad one.
func (d *Document) Validate(reg *scoring.Registry) error {
	if err := reg.Validate(scoring.Config{Policy: d.Policy, Weights: d.Weights}); err != nil {
		return err
	}
	if err := d.Admission.validate("admission"); err != nil {
		return err
	}
	if err := d.Timeouts.validate("timeouts"); err != nil {
		return err
	}
	if err := d.Disagg.validate(""); err != nil {
		return err
	}
	if err := d.Federation.validate(); err != nil {
		return err
	}
	if err := d.validateCascades(); err != nil {
		return err
	}
	if err := validateMigrationLimit("migration_limit", d.MigrationLimit); err != nil {
		return err
	}
	for name, m := range d.Models {
		if name == "" {
			return errors.New("models: empty model name")
		}
		r := d.For(name)
		if err := reg.Validate(r.Scoring); err != nil {
			return fmt.Errorf("models.%s.%w", name, err)
		}
		if m.Admission != nil {
			if err := m.Admission.validate("models." + name + ".admission"); err != nil {
				return err
			}
		}
		if err := m.Timeouts.validate("models." + name + ".timeouts"); err != nil {
			return err
		}
		if err := m.Disagg.validate("models." + name + "."); err != nil {
			return err
		}
		if err := validateMigrationLimit("models."+name+".migration_limit", m.MigrationLimit); err != nil {
			return err
		}
		if err := m.ScaleToZero.validate("models." + name + ".scale_to_zero"); err != nil {
			return err
		}
	}
	return nil
}

func validateMigrationLimit(where string, n *int) error {
	if n != nil && (*n < 0 || *n > maxMigrationLimit) {
		return fmt.Errorf("%s: want 0 (off) to %d, got %d", where, maxMigrationLimit, *n)
	}
	return nil
}

func (t *Timeouts) validate(where string) error {
	if t == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		v    *string
	}{{"response_header", t.ResponseHeader}, {"stream_idle", t.StreamIdle}} {
		if f.v == nil {
			continue
		}
		if d, err := time.ParseDuration(*f.v); err != nil || d <= 0 {
			return fmt.Errorf("%s.%s: want a duration > 0 like \"60s\", got %q", where, f.name, *f.v)
		}
	}
	if h := t.FirstTokenHold; h != nil && *h != "auto" {
		if d, err := time.ParseDuration(*h); err != nil || d < 0 {
			return fmt.Errorf("%s.first_token_hold: want \"auto\" or a duration ≥ 0 like \"5s\", got %q", where, *h)
		}
	}
	return nil
}

func (t *Timeouts) apply(u UpstreamTimeouts) UpstreamTimeouts {
	if t == nil {
		return u
	}
	if t.ResponseHeader != nil {
		if d, err := time.ParseDuration(*t.ResponseHeader); err == nil {
			u.ResponseHeader = d
		}
	}
	if t.StreamIdle != nil {
		if d, err := time.ParseDuration(*t.StreamIdle); err == nil {
			u.StreamIdle = d
		}
	}
	if h := t.FirstTokenHold; h != nil {
		if *h == "auto" {
			u.HoldAuto, u.FirstTokenHold = true, 0
		} else if d, err := time.ParseDuration(*h); err == nil {
			u.HoldAuto, u.FirstTokenHold = false, d
		}
	}
	return u
}

func (a Admission) validate(where string) error {
	if a.MaxInFlight != nil && *a.MaxInFlight < 0 {
		return fmt.Errorf("%s.max_in_flight: must be ≥ 0 (0 = unlimited), got %d", where, *a.MaxInFlight)
	}
	if a.MaxQueue != nil && *a.MaxQueue < 0 {
		return fmt.Errorf("%s.max_queue: must be ≥ 0, got %d", where, *a.MaxQueue)
	}
	if a.QueueTimeout != nil {
		d, err := time.ParseDuration(*a.QueueTimeout)
		if err != nil || d < 0 {
			return fmt.Errorf("%s.queue_timeout: want a duration ≥ 0 like \"10s\", got %q", where, *a.QueueTimeout)
		}
	}
	return nil
}

// For resolves the policy of one model: the model's override fields on top of
// the document's defaults.
func (d *Document) For(model string) Resolved {
	r := Resolved{Scoring: scoring.Config{Policy: d.Policy, Weights: d.Weights}}
	r.Limits = d.Admission.apply(Limits{MaxQueue: 1024, QueueTimeout: 30 * time.Second})
	r.Timeouts = d.Timeouts.apply(UpstreamTimeouts{ResponseHeader: DefaultResponseHeaderTimeout,
		StreamIdle: DefaultStreamIdleTimeout, HoldAuto: true})
	r.Disagg = d.Disagg.apply(DisaggPolicy{Enabled: true, MinUncachedTokens: DefaultDisaggMinUncachedTokens, Fallback: true})
	r.MigrationLimit = DefaultMigrationLimit
	if d.MigrationLimit != nil {
		r.MigrationLimit = *d.MigrationLimit
	}
	if m, ok := d.Models[model]; ok {
		if m.MigrationLimit != nil {
			r.MigrationLimit = *m.MigrationLimit
		}
		r.Timeouts = m.Timeouts.apply(r.Timeouts)
		r.Disagg = m.Disagg.apply(r.Disagg)
		if m.Policy != "" {
			r.Scoring.Policy = m.Policy
		}
		if m.Weights != nil {
			r.Scoring.Weights = m.Weights
		}
		if m.Admission != nil {
			r.Limits = m.Admission.apply(r.Limits)
		}
	}
	return r
}

func (a Admission) apply(l Limits) Limits {
	if a.MaxInFlight != nil {
		l.MaxInFlight = *a.MaxInFlight
	}
	if a.MaxQueue != nil {
		l.MaxQueue = *a.MaxQueue
	}
	if a.QueueTimeout != nil {
		if d, err := time.ParseDuration(*a.QueueTimeout); err == nil {
			l.QueueTimeout = d
		}
	}
	return l
}
