// Package testbed runs a real Consul dev agent and a real Nomad agent (server and client in one
// process) on free loopback ports, with the freshly built Oasis plugins loaded, for end-to-end
// tests. One stack serves a whole test package (see Main); Close leaves no process, data
// directory or cgroup behind. Both agents run with ACLs on, bootstrapped, as production clusters
// run them (see acl.go; Options.NoACLs turns them off). StartFederation runs several such stacks
// as federated datacenters (see federation.go).
//
// The binaries come from `make hashistack` (bin/nomad, bin/consul at the repository root) or from
// OASIS_NOMAD_BIN / OASIS_CONSUL_BIN.
package testbed

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/oasis-llm/oasis/internal/gobuild"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// Options tunes a stack. The zero value is a complete stack.
type Options struct {
	// NomadConfig is extra agent HCL appended to the generated configuration.
	NomadConfig string
	// LLMPluginConfig replaces the body of the llm driver's plugin config block. Empty means
	// `binaries = { sim = "<BinDir>/oasis-sim" }`.
	LLMPluginConfig string
	// LLMPluginExtra is appended to the llm driver's default plugin config body, e.g.
	// `allow_task_binary = true` for jobs that run an engine they downloaded themselves.
	LLMPluginExtra string
	// Dir, when set, is where the stack lives (created if missing, must be empty); otherwise a
	// new temporary directory. `make up` keeps its stack under the checkout's .oasis/.
	Dir string
	// NoACLs runs both agents without ACLs, as a development cluster does. The zero value runs
	// them as production clusters do (see acl.go); only a test that says why turns ACLs off.
	NoACLs bool
	// Logf receives progress lines (testing.T.Logf or log.Printf). Nil is silent.
	Logf func(format string, args ...any)
	// ExtraPlugins are more Nomad plugin binaries for the agent, by the file name it gives them
	// in PluginDir (also the name of their `plugin "<name>" { config {} }` block) to the path
	// of the binary the test built (test/e2e/devicemock's mocked-GPU device plugin).
	ExtraPlugins map[string]string
	// Bridge sets the client up for network mode "bridge" (Consul Connect sidecars): the CNI
	// plugins of `make hashistack` (bin/cni, or OASIS_CNI_PATH), a bridge and subnet of the
	// stack's own, and Consul's HTTP API on a unix socket too, which a sidecar inside an
	// allocation's namespace reaches (see mesh.go). Needs root and iptables (`make deps`).
	Bridge bool
}

// Stack is one running Consul + Nomad pair.
type Stack struct {
	// Dir holds everything the stack writes: agent configs, logs, data, built binaries.
	Dir string
	// ports is the client's dynamic port window, held until Close.
	ports *testutil.PortWindow
	// BinDir holds the Oasis binaries built from ./cmd/... for this stack.
	BinDir string
	// PluginDir is Nomad's plugin_dir: the Oasis plugin binaries.
	PluginDir string
	// ConsulAddr is Consul's HTTP address, host:port.
	ConsulAddr string
	// NomadAddr is Nomad's HTTP address as a URL.
	NomadAddr string
	// Consul and Nomad are clients of the agents, holding the management tokens when ACLs are on.
	Consul *consulapi.Client
	Nomad  *nomadapi.Client
	// ConsulToken and NomadToken are the management tokens made by bootstrapping the agents'
	// ACL systems ("" with NoACLs).
	ConsulToken string
	NomadToken  string
	// NodeID is the id of the stack's single Nomad client node.
	NodeID string
	// Datacenter is the Consul datacenter and the Nomad client's datacenter ("dc1" for a single
	// stack); Region is the Nomad region ("global" for a single stack, the datacenter's name in a
	// federation).
	Datacenter string
	Region     string

	root        string
	nomadBin    string
	consulBin   string
	nomadConfig string
	consul      *process
	nomad       *process
	logf        func(string, ...any)
	acls        bool
	// nomadConsulToken is the Nomad agent's own Consul token.
	nomadConsulToken string
	// consulAgentToken is the Consul agent's own token.
	consulAgentToken string
	// fed places the stack in a federation; nil for a single stack.
	fed *dcConfig
	// consulSerfWAN and nomadSerf are the addresses other datacenters join.
	consulSerfWAN string
	nomadSerf     string
	// ConsulHTTPSocket is Consul's HTTP API as a unix socket path, set with Options.Bridge: a
	// process in an allocation's network namespace cannot reach the agent's loopback address.
	ConsulHTTPSocket string
	// bridge is the client's bridge network (Options.Bridge); nil otherwise.
	bridge *bridgeNet
}

// Start builds the Oasis binaries, starts Consul and Nomad, and waits until Nomad has a leader
// and its client node is ready. On error everything already started is torn down.
func Start(ctx context.Context, opts Options) (s *Stack, err error) {
	s, err = newStack(opts, opts.Dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			if cerr := s.Close(); cerr != nil {
				s.logf("testbed: cleanup after failed start: %v", cerr)
			}
			s = nil
		}
	}()
	if err := s.buildOasis(ctx); err != nil {
		return s, err
	}
	return s, s.run(ctx, opts)
}

// newStack resolves the binaries and creates the stack's directory; it starts nothing.
func newStack(opts Options, dir string) (*Stack, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	nomadBin, err := hashiBinary(root, "nomad", "OASIS_NOMAD_BIN")
	if err != nil {
		return nil, err
	}
	consulBin, err := hashiBinary(root, "consul", "OASIS_CONSUL_BIN")
	if err != nil {
		return nil, err
	}
	dir, err = stackDir(dir)
	if err != nil {
		return nil, err
	}
	// Tasks and their supervisors may run as other users; the tree must be traversable.
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, fmt.Errorf("opening stack directory: %w", err)
	}
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	return &Stack{
		Dir:        dir,
		BinDir:     filepath.Join(dir, "bin"),
		PluginDir:  filepath.Join(dir, "plugins"),
		Datacenter: "dc1",
		Region:     "global",
		root:       root,
		nomadBin:   nomadBin,
		consulBin:  consulBin,
		logf:       logf,
		acls:       !opts.NoACLs,
	}, nil
}

// run starts the agents of a stack whose binaries are in place.
func (s *Stack) run(ctx context.Context, opts Options) error {
	if opts.Bridge {
		if err := s.setupBridge(); err != nil {
			return err
		}
	}
	if err := s.onFreshPorts("consul", func() error { return s.startConsul(ctx) }, func() error {
		return stopProcess(s.consul, 10*time.Second)
	}); err != nil {
		return err
	}
	if err := s.onFreshPorts("nomad", func() error { return s.startNomad(ctx, opts) }, func() error {
		if err := stopProcess(s.nomad, 10*time.Second); err != nil {
			return err
		}
		// The next attempt bootstraps a new server on new ports: no raft peer of the old ones.
		return os.RemoveAll(s.nomadDataDir())
	}); err != nil {
		return err
	}
	if s.acls {
		return s.wireWorkloadIdentity(ctx)
	}
	return nil
}

func stackDir(dir string) (string, error) {
	if dir == "" {
		dir, err := os.MkdirTemp("", "oasis-testbed-")
		if err != nil {
			return "", fmt.Errorf("creating stack directory: %w", err)
		}
		// The llm driver runs engines as nobody (its default_user): they must
		// reach their binaries under BinDir and their task directories.
		if err := os.Chmod(dir, 0o755); err != nil {
			return "", fmt.Errorf("opening stack directory to the engines' user: %w", err)
		}
		return dir, nil
	}
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("resolving stack directory: %w", err)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating stack directory: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", fmt.Errorf("reading stack directory: %w", err)
	}
	if len(entries) > 0 {
		return "", fmt.Errorf("stack directory %s is not empty (is a stack already up? `make down` stops it)", dir)
	}
	return dir, nil
}

// Bin returns the path of an Oasis binary built for this stack (for example "oasis-sim").
func (s *Stack) Bin(name string) string { return filepath.Join(s.BinDir, name) }

// RepoRoot finds the repository root: the nearest directory above the working directory whose
// go.mod declares the Oasis module.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding repository root: %w", err)
	}
	for {
		data, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.HasPrefix(string(data), "module github.com/oasis-llm/oasis\n") {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("finding repository root: no go.mod of github.com/oasis-llm/oasis above the working directory")
		}
		dir = parent
	}
}

func hashiBinary(root, name, env string) (string, error) {
	path := os.Getenv(env)
	if path == "" {
		path = filepath.Join(root, "bin", name)
	}
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s binary not found at %s (run `make hashistack`, or set %s): %w", name, path, env, err)
	}
	return path, nil
}

// buildOasis builds every command under ./cmd into BinDir and copies the Nomad plugins into
// PluginDir, so the agent always loads the code under test.
func (s *Stack) buildOasis(ctx context.Context) error {
	if err := os.MkdirAll(s.PluginDir, 0o755); err != nil {
		return fmt.Errorf("creating plugin dir: %w", err)
	}
	if err := os.MkdirAll(s.BinDir, 0o755); err != nil {
		return fmt.Errorf("creating bin dir: %w", err)
	}
	if prebuilt := os.Getenv(PrebuiltEnv); prebuilt != "" {
		// `make e2e` builds ./cmd/... once for every e2e package instead of once per package.
		if err := s.copyPrebuilt(prebuilt); err != nil {
			return err
		}
	} else {
		cmds, err := filepath.Glob(filepath.Join(s.root, "cmd", "*", "main.go"))
		if err != nil || len(cmds) == 0 {
			s.logf("testbed: no commands under cmd/ to build")
			return nil
		}
		start := time.Now()
		if err := gobuild.Commands(ctx, s.BinDir, "github.com/oasis-llm/oasis/cmd/..."); err != nil {
			return err
		}
		s.logf("testbed: built Oasis commands in %s", time.Since(start).Round(time.Millisecond))
	}
	for _, plugin := range []string{"nomad-driver-llm", "nomad-device-gpu"} {
		src := s.Bin(plugin)
		if _, err := os.Stat(src); err != nil {
			continue
		}
		if err := copyFile(src, filepath.Join(s.PluginDir, plugin)); err != nil {
			return fmt.Errorf("installing plugin %s: %w", plugin, err)
		}
	}
	return nil
}

// PrebuiltEnv names a directory holding binaries just built from ./cmd/... (make e2e sets it to
// bin/); the stack copies every command found there instead of building again.
const PrebuiltEnv = "OASIS_TESTBED_PREBUILT"

func (s *Stack) copyPrebuilt(dir string) error {
	cmds, err := filepath.Glob(filepath.Join(s.root, "cmd", "*", "main.go"))
	if err != nil {
		return err
	}
	for _, c := range cmds {
		name := filepath.Base(filepath.Dir(c))
		if err := copyFile(filepath.Join(dir, name), s.Bin(name)); err != nil {
			return fmt.Errorf("copying prebuilt %s from %s=%s: %w", name, PrebuiltEnv, dir, err)
		}
	}
	s.logf("testbed: using the Oasis commands prebuilt in %s", dir)
	return nil
}

func (s *Stack) hasPlugin(name string) bool {
	_, err := os.Stat(filepath.Join(s.PluginDir, name))
	return err == nil
}

func copyFile(src, dst string) error {
	data, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, data, 0o755)
}

// process is an agent the stack started; done closes when it has exited.
type process struct {
	pid  int
	proc *os.Process
	done chan struct{}
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// startProcess runs an agent in its own process group with its output in logPath, with the
// test's environment (less AWS_CA_BUNDLE) plus extraEnv, whose values win.
func startProcess(bin string, args []string, logPath string, extraEnv ...string) (*process, error) {
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating %s: %w", logPath, err)
	}
	// The child holds its own copy of the descriptor.
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// AWS_CA_BUNDLE makes Nomad's cloud fingerprinters fail at start (NOTES §3); the agents have
	// no use for it.
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "AWS_CA_BUNDLE=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// os/exec keeps the last value of a repeated variable.
	cmd.Env = append(cmd.Env, extraEnv...)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", filepath.Base(bin), err)
	}
	p := &process{pid: cmd.Process.Pid, proc: cmd.Process, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// stopProcess interrupts an agent and kills its process group if it has not exited within grace.
func stopProcess(p *process, grace time.Duration) error {
	if p == nil || p.exited() {
		return nil
	}
	_ = p.proc.Signal(syscall.SIGINT)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(5 * time.Second):
		return fmt.Errorf("process %d did not exit after SIGKILL", p.pid)
	}
}

// errPortTaken is why an agent exited at start when another process bound one of the ports
// FreePorts had just found free: a program outside the tests that binds a fixed port of the
// test ports' range, or, when every test port window is held and FreePorts falls back to
// ephemeral ports, an outbound connection's.
var errPortTaken = errors.New("a port it was given was taken by another process before it bound it")

// exitedError is the permanentError for an agent that exited while the stack waited for it:
// errPortTaken when its log says a bind failed, so that the caller can start it again.
func (s *Stack) exitedError(name, logName string) error {
	if strings.Contains(s.tail(logName), "address already in use") {
		return permanentError{fmt.Errorf("%s exited: %w", name, errPortTaken)}
	}
	return permanentError{fmt.Errorf("%s exited", name)}
}

// onFreshPorts runs start, which picks its ports with FreePorts, up to three times while the
// agent exits because one of them was taken in between; stop ends the failed attempt.
func (s *Stack) onFreshPorts(name string, start, stop func() error) error {
	for attempt := 1; ; attempt++ {
		err := start()
		if attempt == 3 || !errors.Is(err, errPortTaken) {
			return err
		}
		if err := stop(); err != nil {
			return fmt.Errorf("stopping %s after it lost a port: %w", name, err)
		}
		s.logf("testbed: %s lost a port to another process at start; starting it again on new ports", name)
	}
}

// permanentError ends a poll at once: waiting longer cannot change the outcome.
type permanentError struct{ error }

func (e permanentError) Unwrap() error { return e.error }

// poll calls check every interval until it reports done, returns a permanentError, or ctx ends.
// Other errors are treated as transient and reported only if the wait times out.
func poll(ctx context.Context, interval time.Duration, what string, check func() (bool, error)) error {
	var last error
	for {
		ok, err := check()
		if err == nil && ok {
			return nil
		}
		var perm permanentError
		if errors.As(err, &perm) {
			return fmt.Errorf("waiting for %s: %w", what, perm.error)
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			if last != nil {
				return fmt.Errorf("waiting for %s: %w (last error: %v)", what, ctx.Err(), last)
			}
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(interval):
		}
	}
}
