package testbed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
)

// The stack runs Consul and Nomad as a production cluster does: ACLs on with a default-deny
// policy, bootstrapped once, Nomad's workload identities wired to Consul by a JWT auth method (what
// `nomad setup consul` creates), and the Oasis jobs' own policies created by jobs/acl/setup.sh,
// the script operators run. What the test bed needs beyond that (agent tokens) is below.

// consulAgentRules lets the Consul agent keep its own node's catalog entry in sync.
const consulAgentRules = `node_prefix "" {
  policy = "write"
}
service_prefix "" {
  policy = "read"
}`

// nomadAgentConsulRules is what the Nomad agent asks Consul for on its own account: reading the
// local agent's services and checks to reconcile them, registering the agents' own nomad and
// nomad-client services, and deregistering workload services (their identities' tokens are gone
// by then), which takes service write on every name.
const nomadAgentConsulRules = `agent_prefix "" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
service_prefix "" {
  policy = "write"
}`

// AuthMethod is the Consul auth method Nomad's workload identities log in with (the name `nomad
// setup consul` gives it, and Nomad's default consul.service_auth_method and task_auth_method).
const AuthMethod = "nomad-workloads"

// consulAudience is the audience of the identities Nomad signs for Consul.
const consulAudience = "consul.io"

// consulACLConfig is the acl block of Consul's configuration. No token persistence: a dev agent
// has no data dir and would write acl-tokens.json into its working directory; the stack sets the
// agent's token again whenever it starts Consul.
func consulACLConfig() map[string]any {
	return map[string]any{"enabled": true, "default_policy": "deny"}
}

// bootstrapConsulACL bootstraps Consul's ACL system, keeps the management token for the stack's
// client, gives the agent its token, and makes the token Nomad's agent uses.
func (s *Stack) bootstrapConsulACL(ctx context.Context) error {
	var mgmt *consulapi.ACLToken
	err := poll(ctx, 100*time.Millisecond, "consul ACL bootstrap", func() (bool, error) {
		// The ACL system comes up a moment after the leader: until then Bootstrap fails.
		t, _, err := s.Consul.ACL().Bootstrap()
		mgmt = t
		return err == nil, err
	})
	if err != nil {
		return err
	}
	s.ConsulToken = mgmt.SecretID
	if s.Consul, err = newConsulClient(s.ConsulAddr, s.ConsulToken); err != nil {
		return err
	}
	agent, err := s.consulPolicyToken("consul-agent", consulAgentRules)
	if err != nil {
		return err
	}
	if _, err := s.Consul.Agent().UpdateAgentACLToken(agent, nil); err != nil {
		return fmt.Errorf("setting the consul agent's token: %w", err)
	}
	s.consulAgentToken = agent
	if s.nomadConsulToken, err = s.consulPolicyToken("nomad-agent", nomadAgentConsulRules); err != nil {
		return err
	}
	return nil
}

// consulPolicyToken creates a policy and a token holding it, and returns the token's secret.
func (s *Stack) consulPolicyToken(name, rules string) (string, error) {
	p, _, err := s.Consul.ACL().PolicyCreate(&consulapi.ACLPolicy{Name: name, Rules: rules}, nil)
	if err != nil {
		return "", fmt.Errorf("creating consul policy %s: %w", name, err)
	}
	t, _, err := s.Consul.ACL().TokenCreate(&consulapi.ACLToken{Description: name,
		Policies: []*consulapi.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
	if err != nil {
		return "", fmt.Errorf("creating consul token %s: %w", name, err)
	}
	return t.SecretID, nil
}

// nomadConsulACLConfig is what the consul block of Nomad's configuration holds with ACLs on: the
// agent's own token and the identities Nomad signs for services and tasks.
func (s *Stack) nomadConsulACLConfig() string {
	return fmt.Sprintf(`  token = %q
  service_identity {
    aud = [%[2]q]
    ttl = "1h"
  }
  task_identity {
    aud = [%[2]q]
    ttl = "1h"
  }
`, s.nomadConsulToken, consulAudience)
}

// bootstrapNomadACL bootstraps Nomad's ACL system once its leader is elected and keeps the
// management token for the stack's client.
func (s *Stack) bootstrapNomadACL(ctx context.Context) error {
	var mgmt *nomadapi.ACLToken
	err := poll(ctx, 200*time.Millisecond, "nomad ACL bootstrap", func() (bool, error) {
		if s.nomad.exited() {
			return false, s.exitedError("nomad", "nomad.log")
		}
		t, _, err := s.Nomad.ACLTokens().Bootstrap(nil)
		mgmt = t
		return err == nil, err
	})
	if err != nil {
		return err
	}
	s.NomadToken = mgmt.SecretID
	s.Nomad.SetSecretID(s.NomadToken)
	return nil
}

// wireWorkloadIdentity does what `nomad setup consul` does, except that it binds no role to every
// task: Consul trusts Nomad's JWKS for workload identities, services get service identities, and
// then jobs/acl/setup.sh gives the Oasis jobs' tasks their own least-privilege roles. A task
// that needs Consul and has no role of its own cannot log in, which is what the e2e suite shows.
func (s *Stack) wireWorkloadIdentity(ctx context.Context) error {
	_, _, err := s.Consul.ACL().AuthMethodCreate(&consulapi.ACLAuthMethod{
		Name: AuthMethod, Type: "jwt", DisplayName: AuthMethod, TokenLocality: "local",
		Description: "Nomad workload identities",
		Config: map[string]any{
			"JWKSURL":          s.NomadAddr + "/.well-known/jwks.json",
			"JWTSupportedAlgs": []string{"RS256"},
			"BoundAudiences":   []string{consulAudience},
			"ClaimMappings": map[string]string{
				"nomad_namespace": "nomad_namespace", "nomad_job_id": "nomad_job_id",
				"nomad_task": "nomad_task", "nomad_service": "nomad_service",
			},
		},
	}, nil)
	if err != nil {
		return fmt.Errorf("creating consul auth method %s: %w", AuthMethod, err)
	}
	_, _, err = s.Consul.ACL().BindingRuleCreate(&consulapi.ACLBindingRule{
		Description: "Nomad services", AuthMethod: AuthMethod,
		BindType: consulapi.BindingRuleBindTypeService, BindName: "${value.nomad_service}",
		Selector: `"nomad_service" in value`,
	}, nil)
	if err != nil {
		return fmt.Errorf("creating consul binding rule for services: %w", err)
	}
	if s.fed != nil && !s.fed.primary() {
		if err := s.waitACLObjectsReplicated(ctx); err != nil {
			return err
		}
	}
	return s.runACLSetup(ctx)
}

// runACLSetup runs jobs/acl/setup.sh, the operators' script, with the stack's CLIs and
// management tokens, so the policies the tests run under are the files the docs point to.
func (s *Stack) runACLSetup(ctx context.Context) error {
	script := filepath.Join(s.root, "jobs", "acl", "setup.sh")
	cmd := exec.CommandContext(ctx, "/bin/sh", script)
	// The last PATH wins (os/exec keeps the last value of a repeated variable).
	cmd.Env = append(s.Env(), "PATH="+filepath.Dir(s.consulBin)+":"+filepath.Dir(s.nomadBin)+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("running %s: %w\n%s", script, err, out)
	}
	s.logf("testbed: %s", strings.ReplaceAll(strings.TrimSpace(string(out)), "\n", "; "))
	return nil
}

// Env is the environment for a command run outside Nomad against the stack: the agents'
// addresses and, with ACLs on, the management tokens (CONSUL_HTTP_TOKEN, NOMAD_TOKEN).
func (s *Stack) Env() []string {
	var env []string
	for _, kv := range os.Environ() {
		switch strings.SplitN(kv, "=", 2)[0] {
		case "CONSUL_HTTP_ADDR", "CONSUL_HTTP_TOKEN", "CONSUL_HTTP_TOKEN_FILE", "NOMAD_ADDR", "NOMAD_TOKEN", "AWS_CA_BUNDLE":
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "CONSUL_HTTP_ADDR="+s.ConsulAddr, "NOMAD_ADDR="+s.NomadAddr)
	if s.ConsulToken != "" {
		env = append(env, "CONSUL_HTTP_TOKEN="+s.ConsulToken)
	}
	if s.NomadToken != "" {
		env = append(env, "NOMAD_TOKEN="+s.NomadToken)
	}
	return env
}

// ConsulRoleToken creates a Consul token holding a role (for example "oasis-router", created by
// jobs/acl/setup.sh), for a process the test runs outside Nomad with the job's privileges. With
// ACLs off it returns "".
func (s *Stack) ConsulRoleToken(role string) (string, error) {
	if s.ConsulToken == "" {
		return "", nil
	}
	t, _, err := s.Consul.ACL().TokenCreate(&consulapi.ACLToken{Description: "testbed " + role,
		Roles: []*consulapi.ACLTokenRoleLink{{Name: role}}}, nil)
	if err != nil {
		return "", fmt.Errorf("creating a consul token with role %s: %w", role, err)
	}
	return t.SecretID, nil
}

func newConsulClient(addr, token string) (*consulapi.Client, error) {
	cfg := consulapi.DefaultConfig()
	cfg.Address, cfg.Token = addr, token
	c, err := consulapi.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating consul client: %w", err)
	}
	return c, nil
}
