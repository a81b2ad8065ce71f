package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"
)

// A federation is N datacenters on one machine, each a Stack of its own: a Consul server whose
// datacenter is "dc1", "dc2", ... (WAN-federated, primary dc1) and a Nomad region of the same
// name (server and client; authoritative region dc1), each Nomad wired to its own datacenter's
// Consul. The names match so that one word says where something runs: the job-level `region`,
// the Nomad client's `datacenter` and Consul's `?dc=` are all "dc2" in the second datacenter.
//
// With ACLs on, the primaries own them: Consul replicates policies, roles and global tokens to
// every secondary (enable_token_replication with a replication token), and Nomad replicates its
// policies and global tokens from the authoritative region (replication_token). The management
// tokens made by bootstrapping dc1 therefore work in every datacenter. Consul's auth methods and
// binding rules are local to a datacenter: each one gets its own nomad-workloads method, trusting
// its own Nomad's JWKS, and jobs/acl/setup.sh runs once per datacenter for its binding rules.

// Federation is a running set of datacenters. DCs[0] is the primary.
type Federation struct {
	// Dir holds one directory per datacenter (dc1, dc2, ...).
	Dir string
	DCs []*Stack
}

// FederationOptions tunes StartFederation. Options apply to every datacenter; Options.Dir is the
// federation's directory.
type FederationOptions struct {
	Options
	// DCs is the number of datacenters; 0 means 2.
	DCs int
}

// dcConfig is what places a Stack in a federation.
type dcConfig struct {
	name, primaryName string
	// Addresses of the primary's Consul serf WAN and Nomad serf listeners ("" in the primary).
	consulWANJoin, nomadJoin string
	// The primary's tokens a secondary starts with.
	consulReplicationToken, consulAgentToken, nomadReplicationToken string
	primaryConsul                                                   *consulapi.Client
}

func (c *dcConfig) primary() bool { return c.name == c.primaryName }

func (c *dcConfig) consulConfig(config map[string]any) {
	config["node_name"] = "oasis-testbed-" + c.name
	config["datacenter"] = c.name
	config["primary_datacenter"] = c.primaryName
	if c.primary() {
		return
	}
	config["retry_join_wan"] = []string{c.consulWANJoin}
	config["retry_interval_wan"] = "1s"
	if acl, ok := config["acl"].(map[string]any); ok {
		acl["enable_token_replication"] = true
		acl["tokens"] = map[string]string{"replication": c.consulReplicationToken, "agent": c.consulAgentToken}
	}
}

// nomadConfig returns the lines a federated Nomad agent adds to its top level and to its server
// and acl blocks (its client's dynamic ports are its stack's window, as every stack's: ports.go).
func (c *dcConfig) nomadConfig() (top, server, acl string) {
	top = fmt.Sprintf("region     = %q\ndatacenter = %q\n", c.name, c.name)
	server = fmt.Sprintf("  authoritative_region = %q\n", c.primaryName)
	if !c.primary() {
		server += fmt.Sprintf("  server_join {\n    retry_join     = [%q]\n    retry_interval = \"1s\"\n  }\n", c.nomadJoin)
		if c.nomadReplicationToken != "" {
			acl = fmt.Sprintf("  replication_token = %q\n", c.nomadReplicationToken)
		}
	}
	return top, server, acl
}

// consulReplicationRules is what Consul documents for an ACL replication token.
const consulReplicationRules = `acl = "write"
operator = "write"
service_prefix "" {
  policy     = "read"
  intentions = "read"
}`

// StartFederation starts the datacenters one after the other, primary first, and waits until
// every Consul server is an alive WAN member, /v1/regions lists every region and every region's
// client node is ready. On error everything already started is torn down.
func StartFederation(ctx context.Context, opts FederationOptions) (f *Federation, err error) {
	n := opts.DCs
	if n == 0 {
		n = 2
	}
	dir, err := stackDir(opts.Dir)
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("opening federation directory: %w", err)
	}
	f = &Federation{Dir: dir}
	defer func() {
		if err != nil {
			if cerr := f.Close(); cerr != nil && opts.Logf != nil {
				opts.Logf("testbed: cleanup after failed start: %v", cerr)
			}
			f = nil
		}
	}()
	for i := range n {
		s, err := f.startDC(ctx, opts.Options, i)
		if s != nil {
			f.DCs = append(f.DCs, s)
		}
		if err != nil {
			return f, fmt.Errorf("datacenter dc%d: %w", i+1, err)
		}
	}
	return f, f.waitFederated(ctx)
}

// startDC starts datacenter i of n: the primary builds the Oasis binaries, the others share them.
func (f *Federation) startDC(ctx context.Context, opts Options, i int) (*Stack, error) {
	name := fmt.Sprintf("dc%d", i+1)
	s, err := newStack(opts, filepath.Join(f.Dir, name))
	if err != nil {
		return nil, err
	}
	s.Datacenter, s.Region = name, name
	s.fed = &dcConfig{name: name, primaryName: "dc1"}
	if i == 0 {
		if err := s.buildOasis(ctx); err != nil {
			return s, err
		}
		if err := s.run(ctx, opts); err != nil {
			return s, err
		}
		return s, f.makeReplicationToken(s)
	}
	p := f.DCs[0]
	s.BinDir, s.PluginDir = p.BinDir, p.PluginDir
	s.fed.consulWANJoin, s.fed.nomadJoin = p.consulSerfWAN, p.nomadSerf
	s.ConsulToken, s.NomadToken = p.ConsulToken, p.NomadToken
	s.consulAgentToken, s.nomadConsulToken = p.consulAgentToken, p.nomadConsulToken
	s.fed.consulReplicationToken, s.fed.consulAgentToken = p.fed.consulReplicationToken, p.consulAgentToken
	s.fed.nomadReplicationToken, s.fed.primaryConsul = p.NomadToken, p.Consul
	return s, s.run(ctx, opts)
}

func (f *Federation) makeReplicationToken(primary *Stack) error {
	if !primary.acls {
		return nil
	}
	token, err := primary.consulPolicyToken("consul-replication", consulReplicationRules)
	primary.fed.consulReplicationToken = token
	return err
}

// waitFederated waits until the primary's Consul sees every server alive in the WAN pool and
// its Nomad lists every region.
func (f *Federation) waitFederated(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	p := f.DCs[0]
	err := poll(ctx, 200*time.Millisecond, "consul WAN members alive", func() (bool, error) {
		members, err := p.Consul.Agent().Members(true)
		if err != nil {
			return false, err
		}
		alive := 0
		for _, m := range members {
			if m.Status == 1 { // serf.StatusAlive
				alive++
			}
		}
		return alive == len(f.DCs), nil
	})
	if err != nil {
		return err
	}
	err = poll(ctx, 200*time.Millisecond, "nomad regions listed", func() (bool, error) {
		regions, err := p.Nomad.Regions().List()
		return err == nil && len(regions) == len(f.DCs), err
	})
	if err == nil {
		p.logf("testbed: federation of %d datacenters ready", len(f.DCs))
	}
	return err
}

// DC returns the datacenter named name ("dc1", ...), or nil.
func (f *Federation) DC(name string) *Stack {
	for _, s := range f.DCs {
		if s.Datacenter == name {
			return s
		}
	}
	return nil
}

// Close closes every datacenter, secondaries first (the primary's plugin directory serves them
// all), and removes Dir. It keeps going past errors and returns them all.
func (f *Federation) Close() error {
	var errs []error
	for i := len(f.DCs) - 1; i >= 0; i-- {
		if err := f.DCs[i].Close(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", f.DCs[i].Datacenter, err))
		}
	}
	if f.Dir != "" && os.Getenv("OASIS_TESTBED_KEEP") == "" {
		if err := os.RemoveAll(f.Dir); err != nil {
			errs = append(errs, fmt.Errorf("removing %s: %w", f.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// Agent names one of a stack's two agents.
type Agent string

const (
	AgentConsul Agent = "consul"
	AgentNomad  Agent = "nomad"
)

// Freeze stops an agent's process with SIGSTOP: its sockets stay open and nothing answers, as
// when a machine or a link hangs. Only the agent itself stops; its plugins and tasks keep running.
// Thaw resumes it; Close thaws before stopping.
func (s *Stack) Freeze(a Agent) error { return s.signalAgent(a, syscall.SIGSTOP) }

// Thaw resumes an agent stopped by Freeze.
func (s *Stack) Thaw(a Agent) error { return s.signalAgent(a, syscall.SIGCONT) }

func (s *Stack) signalAgent(a Agent, sig syscall.Signal) error {
	p := s.consul
	if a == AgentNomad {
		p = s.nomad
	}
	if p == nil || p.exited() {
		return fmt.Errorf("%s agent of %s is not running", a, s.Datacenter)
	}
	if err := syscall.Kill(p.pid, sig); err != nil {
		return fmt.Errorf("signalling %s agent %d: %w", a, p.pid, err)
	}
	if sig == syscall.SIGSTOP {
		return waitStopped(p.pid)
	}
	return nil
}

// waitStopped waits until every thread of pid is stopped: kill(2) returns
// before a busy process's threads have taken the signal, and on a loaded
// machine one of them can still answer a request in the meantime.
func waitStopped(pid int) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		stopped, err := allThreadsStopped(pid)
		if err != nil || stopped {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("process %d: threads still running 5 s after SIGSTOP", pid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func allThreadsStopped(pid int) (bool, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return false, fmt.Errorf("reading the threads of %d: %w", pid, err)
	}
	for _, t := range tasks {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/stat", pid, t.Name()))
		if err != nil {
			continue // the thread exited
		}
		// The state follows the parenthesised command name, which may hold spaces.
		i := strings.LastIndexByte(string(stat), ')')
		if i < 0 || i+2 >= len(stat) || (stat[i+2] != 'T' && stat[i+2] != 't') {
			return false, nil
		}
	}
	return true, nil
}

// waitConsulReplication waits until a secondary Consul knows the primary's management token, which
// it can only learn by ACL replication over the WAN.
func (s *Stack) waitConsulReplication(ctx context.Context) error {
	var err error
	if s.Consul, err = newConsulClient(s.ConsulAddr, s.ConsulToken); err != nil {
		return err
	}
	return poll(ctx, 200*time.Millisecond, "consul ACL replication to "+s.Datacenter, func() (bool, error) {
		r, _, err := s.Consul.ACL().Replication(nil)
		if err != nil {
			return false, err
		}
		return r.Running && r.ReplicationType == "tokens" && r.ReplicatedTokenIndex > 0, nil
	})
}

// waitACLObjectsReplicated waits until a secondary Consul holds every policy and role of the
// primary, so that jobs/acl/setup.sh, run against it, finds the objects it made in the primary.
func (s *Stack) waitACLObjectsReplicated(ctx context.Context) error {
	primary := s.fed.primaryConsul
	return poll(ctx, 200*time.Millisecond, "consul policies and roles replicated to "+s.Datacenter, func() (bool, error) {
		var want, got []string
		for _, c := range []*consulapi.Client{primary, s.Consul} {
			policies, _, err := c.ACL().PolicyList(nil)
			if err != nil {
				return false, err
			}
			roles, _, err := c.ACL().RoleList(nil)
			if err != nil {
				return false, err
			}
			var names []string
			for _, p := range policies {
				names = append(names, "policy "+p.Name)
			}
			for _, r := range roles {
				names = append(names, "role "+r.Name)
			}
			sort.Strings(names)
			want, got = got, names
		}
		return strings.Join(want, ",") == strings.Join(got, ","), nil
	})
}

// GlobalConsulToken creates a global Consul token with the named policies in the primary, which
// owns the federation's ACLs, and waits until every datacenter accepts it: a secondary knows a
// global token only once replication has carried it there. With ACLs off it returns "".
func (f *Federation) GlobalConsulToken(ctx context.Context, description string, policies ...string) (string, error) {
	p := f.DCs[0]
	if p.ConsulToken == "" {
		return "", nil
	}
	links := make([]*consulapi.ACLTokenPolicyLink, len(policies))
	for i, name := range policies {
		links[i] = &consulapi.ACLTokenPolicyLink{Name: name}
	}
	t, _, err := p.Consul.ACL().TokenCreate(&consulapi.ACLToken{Description: description, Policies: links},
		(&consulapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return "", fmt.Errorf("creating a global consul token with %s: %w", strings.Join(policies, ", "), err)
	}
	for _, s := range f.DCs[1:] {
		c, err := newConsulClient(s.ConsulAddr, t.SecretID)
		if err != nil {
			return "", err
		}
		err = poll(ctx, 200*time.Millisecond, "the global consul token replicated to "+s.Datacenter, func() (bool, error) {
			_, _, err := c.ACL().TokenReadSelf((&consulapi.QueryOptions{}).WithContext(ctx))
			return err == nil, err
		})
		if err != nil {
			return "", err
		}
	}
	return t.SecretID, nil
}
