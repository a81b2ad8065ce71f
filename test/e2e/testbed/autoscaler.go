package testbed

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/internal/testutil"
)

// AutoscalerPolicyName is the Nomad ACL policy StartAutoscaler makes from
// jobs/acl/nomad-autoscaler.hcl (the one operators apply with jobs/acl/setup.sh).
const AutoscalerPolicyName = "nomad-autoscaler"

// Autoscaler is a Nomad Autoscaler agent (bin/nomad-autoscaler, tools/nomad-autoscaler) acting
// on the stack's jobs' `scaling` policies with metrics from the stack's Prometheus. Its process
// names the stack's directory, so Close of the stack (and `make down`) ends it too.
type Autoscaler struct {
	// URL is the agent's HTTP address (/v1/health).
	URL string
	// Dir holds its configuration and log.
	Dir  string
	proc *process
}

// AutoscalerBinary is the autoscaler the test bed runs: $OASIS_AUTOSCALER_BIN, else the
// checkout's bin/nomad-autoscaler (scripts/hashistack.sh nomad-autoscaler). The error says how
// to get it.
func AutoscalerBinary() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return hashiBinary(root, "nomad-autoscaler", "OASIS_AUTOSCALER_BIN")
}

// StrategyPluginBinary is the Oasis strategy plugin's command (strategy "oasis-sizing"), copied
// into the autoscaler's plugin_dir.
const StrategyPluginBinary = "oasis-autoscaler-strategy"

// StartAutoscaler starts the autoscaler on a free loopback port with the Prometheus APM plugin
// pointed at promURL, the built-in Nomad target and strategies and the Oasis strategy plugin
// ("oasis-sizing", its learned capacity queries against promURL), and waits until it answers.
// With ACLs on its Nomad token holds only jobs/acl/nomad-autoscaler.hcl.
func (s *Stack) StartAutoscaler(ctx context.Context, promURL string) (*Autoscaler, error) {
	bin, err := AutoscalerBinary()
	if err != nil {
		return nil, err
	}
	token, err := s.autoscalerToken()
	if err != nil {
		return nil, err
	}
	ports, err := testutil.FreePorts(1)
	if err != nil {
		return nil, err
	}
	a := &Autoscaler{Dir: filepath.Join(s.Dir, "autoscaler"), URL: fmt.Sprintf("http://127.0.0.1:%d", ports[0])}
	if err := os.MkdirAll(filepath.Join(a.Dir, "plugins"), 0o755); err != nil {
		return nil, err
	}
	// The Oasis strategy plugin (cmd/oasis-autoscaler-strategy) the recipes' policies name.
	if err := copyFile(s.Bin(StrategyPluginBinary), filepath.Join(a.Dir, "plugins", StrategyPluginBinary)); err != nil {
		return nil, fmt.Errorf("installing the autoscaler's %s plugin: %w", StrategyPluginBinary, err)
	}
	cfgPath := filepath.Join(a.Dir, "agent.hcl")
	// The file holds a token: its owner's only.
	if err := os.WriteFile(cfgPath, []byte(autoscalerConfig(a.Dir, ports[0], s.NomadAddr, s.Region, token, promURL)), 0o600); err != nil {
		return nil, err
	}
	a.proc, err = startProcess(bin, []string{"agent", "-config=" + cfgPath}, filepath.Join(a.Dir, "autoscaler.log"))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = poll(ctx, 100*time.Millisecond, "nomad-autoscaler ready", func() (bool, error) {
		if a.proc.exited() {
			return false, permanentError{errors.New("nomad-autoscaler exited")}
		}
		resp, err := http.Get(a.URL + "/v1/health")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return nil, errors.Join(fmt.Errorf("%w\nnomad-autoscaler log:\n%s", err, s.tail("autoscaler/autoscaler.log")), a.Close())
	}
	s.logf("testbed: nomad-autoscaler ready at %s (prometheus %s)", a.URL, promURL)
	return a, nil
}

// Close stops the agent (the stack's Close ends it as well).
func (a *Autoscaler) Close() error { return stopProcess(a.proc, 10*time.Second) }

// Log is the agent's log so far.
func (a *Autoscaler) Log() string {
	b, _ := os.ReadFile(filepath.Join(a.Dir, "autoscaler.log"))
	return string(b)
}

// autoscalerToken is a Nomad client token holding the autoscaler's policy, or "" with ACLs off.
func (s *Stack) autoscalerToken() (string, error) {
	if s.NomadToken == "" {
		return "", nil
	}
	rules, err := os.ReadFile(filepath.Join(s.root, "jobs", "acl", "nomad-autoscaler.hcl"))
	if err != nil {
		return "", err
	}
	_, err = s.Nomad.ACLPolicies().Upsert(&nomadapi.ACLPolicy{Name: AutoscalerPolicyName,
		Description: "Nomad Autoscaler: read and scale jobs' task groups", Rules: string(rules)}, nil)
	if err != nil {
		return "", fmt.Errorf("creating the nomad-autoscaler ACL policy: %w", err)
	}
	tok, _, err := s.Nomad.ACLTokens().Create(&nomadapi.ACLToken{Name: "nomad-autoscaler", Type: "client",
		Policies: []string{AutoscalerPolicyName}}, nil)
	if err != nil {
		return "", fmt.Errorf("creating the nomad-autoscaler token: %w", err)
	}
	return tok.SecretID, nil
}

// autoscalerConfig is the agent configuration: loopback HTTP, the stack's Nomad, policies from
// the jobs' scaling blocks only, the Prometheus APM and the Oasis strategy plugin (the Nomad APM,
// target and strategies are the agent's built-in defaults).
func autoscalerConfig(dir string, port int, nomadAddr, region, token, promURL string) string {
	return fmt.Sprintf(`log_level  = "debug"
plugin_dir = %q

http {
  bind_address = "127.0.0.1"
  bind_port    = %d
}

nomad {
  address = %q
  region  = %q
  token   = %q
}

policy {
  default_evaluation_interval = "10s"
  default_cooldown            = "1m"
}

apm "prometheus" {
  driver = "prometheus"
  config = {
    address = %q
  }
}

strategy "oasis-sizing" {
  driver = %q
  config = {
    prometheus_address = %q
  }
}
`, filepath.Join(dir, "plugins"), port, nomadAddr, region, token, promURL, StrategyPluginBinary, promURL)
}
