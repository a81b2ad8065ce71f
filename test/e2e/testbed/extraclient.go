package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"
)

// This file lets a test run agents of its own beside the stack, from configuration it rendered
// itself (the Terraform node module's, for one): a Consul client agent joining the stack's
// Consul, a second Nomad client joining its servers. They live in a directory of the test's,
// not under Stack.Dir, so Close does not know them: ExtraAgent.Stop ends each one, and must run
// before Close (Close removes the shared /nomad cgroup parent only when no Nomad agent is left).

// NomadServerRPC is the RPC address (host:port) of the stack's Nomad server, what a client's
// servers or server_join.retry_join names.
func (s *Stack) NomadServerRPC() (string, error) {
	peers, err := s.Nomad.Status().Peers()
	if err != nil {
		return "", fmt.Errorf("reading nomad raft peers: %w", err)
	}
	if len(peers) != 1 {
		return "", fmt.Errorf("nomad raft peers %v: want one server", peers)
	}
	return peers[0], nil
}

// ConsulSerfLAN is the LAN gossip address (host:port) of the stack's Consul agent, what a Consul
// client agent's retry_join names.
func (s *Stack) ConsulSerfLAN() (string, error) {
	self, err := s.Consul.Agent().Self()
	if err != nil {
		return "", fmt.Errorf("reading consul agent: %w", err)
	}
	m := self["Member"]
	addr, _ := m["Addr"].(string)
	port, _ := m["Port"].(float64)
	if addr == "" || port == 0 {
		return "", fmt.Errorf("consul agent member %v has no address", m)
	}
	return fmt.Sprintf("%s:%d", addr, int(port)), nil
}

// ClientTokens makes a Consul token for another Consul client agent (the policy the stack's own
// agent holds) and one for another Nomad agent's consul block (the Nomad agent's policy): the
// secrets a node's user-data carries. Both are "" with ACLs off.
func (s *Stack) ClientTokens() (consulAgent, nomadConsul string, err error) {
	if !s.acls {
		return "", "", nil
	}
	token := func(policy string) (string, error) {
		t, _, err := s.Consul.ACL().TokenCreate(&consulapi.ACLToken{Description: "testbed extra " + policy,
			Policies: []*consulapi.ACLTokenPolicyLink{{Name: policy}}}, nil)
		if err != nil {
			return "", fmt.Errorf("creating a consul token with policy %s: %w", policy, err)
		}
		return t.SecretID, nil
	}
	if consulAgent, err = token("consul-agent"); err != nil {
		return "", "", err
	}
	if nomadConsul, err = token("nomad-agent"); err != nil {
		return "", "", err
	}
	return consulAgent, nomadConsul, nil
}

// ExtraAgent is an agent process a test started with StartExtraAgent.
type ExtraAgent struct {
	// Dir holds everything the agent writes (data dirs, its allocations); processes whose working
	// directory or command line lie under it are the agent's.
	Dir string
	// Log is the agent's output.
	Log string
	// NomadDataDir is a Nomad agent's data_dir ("" for a Consul agent): its allocations' ids name
	// the cgroups Stop removes.
	NomadDataDir string
	p            *process
}

// StartExtraAgent runs bin with args (for example `nomad agent -config DIR`) in its own process
// group, output in log, with the environment the stack's agents get (no AWS_CA_BUNDLE).
func StartExtraAgent(bin string, args []string, dir, log, nomadDataDir string) (*ExtraAgent, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	p, err := startProcess(bin, args, log)
	if err != nil {
		return nil, err
	}
	return &ExtraAgent{Dir: dir, Log: log, NomadDataDir: nomadDataDir, p: p}, nil
}

// Pid is the agent's process id.
func (a *ExtraAgent) Pid() int { return a.p.pid }

// Exited reports whether the agent has exited.
func (a *ExtraAgent) Exited() bool { return a.p.exited() }

// Tail returns the last lines of the agent's log.
func (a *ExtraAgent) Tail() string {
	s := &Stack{Dir: filepath.Dir(a.Log)}
	return s.tail(filepath.Base(a.Log))
}

// WaitNomadNode waits until the Nomad node called name is ready with the llm driver detected and
// healthy, and returns it.
func (s *Stack) WaitNomadNode(ctx context.Context, a *ExtraAgent, name string) (*nomadapi.Node, error) {
	var node *nomadapi.Node
	err := poll(ctx, 250*time.Millisecond, "nomad node "+name+" ready", func() (bool, error) {
		if a.Exited() {
			return false, permanentError{errors.New("the agent exited")}
		}
		nodes, _, err := s.Nomad.Nodes().List(nil)
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if n.Name != name || n.Status != "ready" {
				continue
			}
			if d := n.Drivers["llm"]; d == nil || !d.Detected || !d.Healthy {
				return false, nil
			}
			node, _, err = s.Nomad.Nodes().Info(n.ID, nil)
			return err == nil, err
		}
		return false, nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w\nagent log:\n%s", err, a.Tail())
	}
	return node, nil
}

// Stop ends the agent (SIGINT, then SIGKILL of its group), what it started (plugins, logmon,
// engine supervisors, tasks), the mounts under Dir and the cgroups of its allocations. It does not remove
// Dir. Stop the agent's jobs first, while it still runs, so Nomad ends their tasks.
func (a *ExtraAgent) Stop() error {
	if a == nil || a.p == nil {
		return nil
	}
	var errs []error
	var tree map[int]uint64
	if !a.p.exited() {
		tree = descendants(a.p.pid)
	}
	if err := stopProcess(a.p, 20*time.Second); err != nil {
		errs = append(errs, fmt.Errorf("stopping agent %d: %w", a.p.pid, err))
	}
	if err := killTree(tree); err != nil {
		errs = append(errs, err)
	}
	// Its directory's processes and mounts, as Close does for the stack's own.
	own := &Stack{Dir: a.Dir}
	if err := own.killLeftovers(); err != nil {
		errs = append(errs, err)
	}
	if err := own.unmountAll(); err != nil {
		errs = append(errs, err)
	}
	if a.NomadDataDir != "" {
		if err := removeAllocCgroups(a.NomadDataDir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// removeAllocCgroups removes the cgroups named after the allocations under a client's data dir,
// leaving the shared parent to the stack's Close.
func removeAllocCgroups(dataDir string) error {
	dirs := AllocCgroups(dataDir)
	var errs []error
	// Children are listed after their parents.
	for i := len(dirs) - 1; i >= 0; i-- {
		if err := rmdirCgroup(dirs[i]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// AllocCgroups lists the cgroup directories named after the allocations under a client's data
// dir (what removeAllocCgroups removes), so a test can assert that none is left.
func AllocCgroups(dataDir string) []string {
	allocs, _ := os.ReadDir(filepath.Join(dataDir, "alloc"))
	var out []string
	roots, _ := filepath.Glob("/sys/fs/cgroup/*/nomad")
	if isDir("/sys/fs/cgroup/nomad.slice") {
		roots = append(roots, "/sys/fs/cgroup/nomad.slice")
	}
	for _, root := range roots {
		filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			for _, a := range allocs {
				if strings.Contains(filepath.Base(path), a.Name()) {
					out = append(out, path)
				}
			}
			return nil
		})
	}
	return out
}
