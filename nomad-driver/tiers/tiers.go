// Package tiers reads KV offload tier declarations (config.Tier) from Nomad
// variables: at `nomad-driver-llm validate` with the operator's token, and
// at StartTask with the task's own workload identity through the Task API
// socket in its secrets directory, so that Nomad's ACLs decide which jobs
// may use which tier and read its secret.
package tiers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/nomad-driver/config"
)

// Source returns the declaration of a tier.
type Source interface {
	Tier(ctx context.Context, name string) (*config.Tier, error)
}

// Nomad reads declarations from Nomad variables.
type Nomad struct {
	// Client reaches Nomad's HTTP API (or a task's API socket).
	Client *nomadapi.Client
	// Secrets reads the password a declaration references into Tier.Secret;
	// without it Tier.Secret is a placeholder naming the variable.
	Secrets bool
	// Namespace of the job whose tasks use the tiers ("" = the client's).
	Namespace string
}

// Tier reads, parses and validates tier name's declaration and, with
// Secrets, its password. A missing declaration wraps
// config.ErrTierNotDeclared; every error names kv_offload_tier.
func (n Nomad) Tier(ctx context.Context, name string) (*config.Tier, error) {
	q := (&nomadapi.QueryOptions{Namespace: n.Namespace}).WithContext(ctx)
	v, _, err := n.Client.Variables().Read(config.TierVariablePath(name), q)
	if err != nil {
		if errors.Is(err, nomadapi.ErrVariablePathNotFound) {
			// Nomad answers "not found" also where the token may not read the
			// variable: name both causes.
			return nil, &config.FieldError{Field: "kv_offload_tier", Msg: fmt.Sprintf(
				"tier %q: %v: no Nomad variable %s that this token may read (declare the tier there, see nomad-driver/README.md \"KV offload tiers\"; a task reads it with its workload identity, which needs a policy reading oasis/tiers/*: jobs/acl/setup.sh OASIS_TIER_JOBS)",
				name, config.ErrTierNotDeclared, config.TierVariablePath(name))}
		}
		return nil, &config.FieldError{Field: "kv_offload_tier", Msg: fmt.Sprintf(
			"reading tier %q (Nomad variable %s): %v", name, config.TierVariablePath(name), err)}
	}
	t, err := config.ParseTier(name, v.Items)
	if err != nil {
		return nil, err
	}
	if t.SecretPath == "" {
		return t, nil
	}
	if !n.Secrets {
		t.Secret = "<" + t.SecretPath + "#" + t.SecretItem + ">"
		return t, nil
	}
	sv, _, err := n.Client.Variables().Read(t.SecretPath, q)
	if err != nil && !errors.Is(err, nomadapi.ErrVariablePathNotFound) {
		return nil, &config.TierError{Tier: name, Item: "secret_path", Msg: fmt.Sprintf("reading Nomad variable %s: %v", t.SecretPath, err)}
	}
	var secret string
	found := false
	if sv != nil {
		secret, found = sv.Items[t.SecretItem]
	}
	if err := t.CheckSecret(secret, found); err != nil {
		return nil, err
	}
	t.Secret = secret
	return t, nil
}

// TaskAPI is a client of the Nomad Task API socket in a task's secrets
// directory, authenticated with the task's workload identity: the token in
// NOMAD_TOKEN (identity { env = true }) or secrets/nomad_token
// (identity { file = true }).
func TaskAPI(secretsDir string, env map[string]string) (*nomadapi.Client, error) {
	token := env["NOMAD_TOKEN"]
	if token == "" {
		b, err := os.ReadFile(filepath.Join(secretsDir, "nomad_token"))
		if err != nil {
			return nil, &config.FieldError{Field: "kv_offload_tier", Msg: "the driver reads the tier with the task's workload identity, which the task does not expose: add identity { file = true } (or env = true) to the task"}
		}
		token = strings.TrimSpace(string(b))
	}
	cfg := nomadapi.DefaultConfig()
	cfg.Address = "unix://" + filepath.Join(secretsDir, "api.sock")
	cfg.SecretID = token
	cfg.Region, cfg.Namespace = "", ""
	c, err := nomadapi.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("task API client: %w", err)
	}
	return c, nil
}
