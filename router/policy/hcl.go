package policy

import (
	"errors"
	"fmt"

	"github.com/hashicorp/hcl/v2/gohcl"
	"github.com/hashicorp/hcl/v2/hclparse"
)

// The HCL form of the policy document:
//
//	policy  = "weighted"
//	weights = { load = 1, kv_capacity = 0.25 }
//	admission {
//	  max_queue     = 1024
//	  queue_timeout = "30s"
//	}
//	timeouts {
//	  stream_idle = "60s"
//	}
//	federation {
//	  enabled = true
//	  margin  = "50ms"
//	}
//	disaggregation                     = "auto"
//	disaggregation_min_uncached_tokens = 256
//	model "llama-3-8b" {
//	  policy = "least_load"
//	  disaggregation_fallback = "none"
//	  admission { max_in_flight = 64 }
//	  overflow {
//	    pool  = "llama-3-8b-hosted"
//	    when  = "queue_full"
//	    model = "meta-llama/Llama-3-8B-Instruct"
//	  }
//	}
//	model "qwen3-8b" {
//	  scale_to_zero {
//	    hold     = "90s"
//	    max_held = 64
//	  }
//	}
//	hosted_peers = false
//	migration_limit = 2
//	cascade "assistant" {
//	  small            = "llama-3-8b"
//	  large            = "llama-3-70b"
//	  gate             = "logprob"
//	  threshold        = -0.4
//	  max_small_tokens = 512
//	}
type hclDocument struct {
	Policy      string             `hcl:"policy,optional"`
	Weights     map[string]float64 `hcl:"weights,optional"`
	Admission   *hclAdmission      `hcl:"admission,block"`
	Timeouts    *hclTimeouts       `hcl:"timeouts,block"`
	Models      []hclModel         `hcl:"model,block"`
	Federation  *hclFederation     `hcl:"federation,block"`
	Cascades    []hclCascade       `hcl:"cascade,block"`
	HostedPeers *bool              `hcl:"hosted_peers,optional"`
	// MigrationLimit: see Document.MigrationLimit.
	MigrationLimit *int `hcl:"migration_limit,optional"`

	Disaggregation                  *string `hcl:"disaggregation,optional"`
	DisaggregationMinUncachedTokens *int    `hcl:"disaggregation_min_uncached_tokens,optional"`
	DisaggregationFallback          *string `hcl:"disaggregation_fallback,optional"`
}

type hclFederation struct {
	Enabled             *bool    `hcl:"enabled,optional"`
	Margin              *string  `hcl:"margin,optional"`
	QueueWaitBudget     *string  `hcl:"queue_wait_budget,optional"`
	MaxSpillFraction    *float64 `hcl:"max_spill_fraction,optional"`
	ResumeSpillFraction *float64 `hcl:"resume_spill_fraction,optional"`
	BreakerFailures     *int     `hcl:"breaker_failures,optional"`
	BreakerCooldown     *string  `hcl:"breaker_cooldown,optional"`
	SummaryStale        *string  `hcl:"summary_stale,optional"`
}

type hclCascade struct {
	Alias          string  `hcl:"alias,label"`
	Small          string  `hcl:"small"`
	Large          string  `hcl:"large"`
	Gate           string  `hcl:"gate,optional"`
	Threshold      float64 `hcl:"threshold"`
	MaxSmallTokens int     `hcl:"max_small_tokens,optional"`
}

type hclOverflow struct {
	Pool        string  `hcl:"pool"`
	When        string  `hcl:"when,optional"`
	TTFTSeconds float64 `hcl:"ttft_seconds,optional"`
	Model       string  `hcl:"model,optional"`
}

type hclTimeouts struct {
	ResponseHeader *string `hcl:"response_header,optional"`
	StreamIdle     *string `hcl:"stream_idle,optional"`
	FirstTokenHold *string `hcl:"first_token_hold,optional"`
}

type hclAdmission struct {
	MaxInFlight  *int    `hcl:"max_in_flight,optional"`
	MaxQueue     *int    `hcl:"max_queue,optional"`
	QueueTimeout *string `hcl:"queue_timeout,optional"`
}

type hclModel struct {
	Name        string             `hcl:"name,label"`
	Policy      string             `hcl:"policy,optional"`
	Weights     map[string]float64 `hcl:"weights,optional"`
	Admission   *hclAdmission      `hcl:"admission,block"`
	Timeouts    *hclTimeouts       `hcl:"timeouts,block"`
	Overflow    *hclOverflow       `hcl:"overflow,block"`
	HostedPeers *bool              `hcl:"hosted_peers,optional"`
	// MigrationLimit: see Document.MigrationLimit.
	MigrationLimit *int `hcl:"migration_limit,optional"`
	// ScaleToZero: see Model.ScaleToZero.
	ScaleToZero *hclScaleToZero `hcl:"scale_to_zero,block"`

	Disaggregation                  *string `hcl:"disaggregation,optional"`
	DisaggregationMinUncachedTokens *int    `hcl:"disaggregation_min_uncached_tokens,optional"`
	DisaggregationFallback          *string `hcl:"disaggregation_fallback,optional"`
}

type hclScaleToZero struct {
	Hold    *string `hcl:"hold,optional"`
	MaxHeld *int    `hcl:"max_held,optional"`
}

// decodeHCL turns an HCL policy document into a Document (not yet validated).
// Unknown attributes and blocks are errors, as in JSON.
func decodeHCL(data []byte) (*Document, error) {
	f, diags := hclparse.NewParser().ParseHCL(data, "policy.hcl")
	if diags.HasErrors() {
		return nil, fmt.Errorf("decoding policy HCL: %s", diags.Error())
	}
	var h hclDocument
	if diags := gohcl.DecodeBody(f.Body, nil, &h); diags.HasErrors() {
		return nil, fmt.Errorf("decoding policy HCL: %s", diags.Error())
	}
	d := &Document{Policy: h.Policy, Weights: h.Weights, Disagg: Disagg{h.Disaggregation,
		h.DisaggregationMinUncachedTokens, h.DisaggregationFallback}, HostedPeers: h.HostedPeers, MigrationLimit: h.MigrationLimit}
	if err := decodeHCLCascades(d, h.Cascades); err != nil {
		return nil, err
	}
	if h.Admission != nil {
		d.Admission = Admission(*h.Admission)
	}
	if h.Timeouts != nil {
		t := Timeouts(*h.Timeouts)
		d.Timeouts = &t
	}
	if h.Federation != nil {
		f := Federation(*h.Federation)
		d.Federation = &f
	}
	for _, m := range h.Models {
		if d.Models == nil {
			d.Models = map[string]Model{}
		}
		if _, dup := d.Models[m.Name]; dup {
			return nil, fmt.Errorf("decoding policy HCL: model %q defined twice", m.Name)
		}
		mm := Model{Policy: m.Policy, Weights: m.Weights, Disagg: Disagg{m.Disaggregation,
			m.DisaggregationMinUncachedTokens, m.DisaggregationFallback}, HostedPeers: m.HostedPeers, MigrationLimit: m.MigrationLimit}
		if m.Overflow != nil {
			o := Overflow(*m.Overflow)
			mm.Overflow = &o
		}
		if m.Admission != nil {
			a := Admission(*m.Admission)
			mm.Admission = &a
		}
		if m.ScaleToZero != nil {
			z := ScaleToZero(*m.ScaleToZero)
			mm.ScaleToZero = &z
		}
		if m.Timeouts != nil {
			t := Timeouts(*m.Timeouts)
			mm.Timeouts = &t
		}
		d.Models[m.Name] = mm
	}
	if d.Policy == "" && d.Weights == nil && h.Admission == nil && h.Timeouts == nil && len(h.Models) == 0 &&
		h.Federation == nil && d.Disagg.empty() && len(h.Cascades) == 0 && h.HostedPeers == nil &&
		h.MigrationLimit == nil {
		return nil, errors.New("decoding policy HCL: empty document")
	}
	return d, nil
}

func decodeHCLCascades(d *Document, cs []hclCascade) error {
	for _, c := range cs {
		if d.Cascades == nil {
			d.Cascades = map[string]Cascade{}
		}
		if _, dup := d.Cascades[c.Alias]; dup {
			return fmt.Errorf("decoding policy HCL: cascade %q defined twice", c.Alias)
		}
		d.Cascades[c.Alias] = Cascade{Small: c.Small, Large: c.Large, Gate: c.Gate, Threshold: &c.Threshold,
			MaxSmallTokens: c.MaxSmallTokens}
	}
	return nil
}
