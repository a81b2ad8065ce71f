package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/oasis-llm/oasis/internal/gobuild"
	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

var (
	consul    *agent // shared by every test
	simBin    string // built oasis-sim
	routerBin string // built oasis-router
	workDir   string
)

func TestMain(m *testing.M) { os.Exit(run(m)) }

func run(m *testing.M) int {
	var err error
	workDir, err = os.MkdirTemp("", "oasis-router-integration-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(workDir)
	simBin = filepath.Join(workDir, "oasis-sim")
	routerBin = filepath.Join(workDir, "oasis-router")
	if err := gobuild.Commands(context.Background(), workDir, "github.com/oasis-llm/oasis/cmd/oasis-sim", "github.com/oasis-llm/oasis/cmd/oasis-router"); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	consul, err = startConsul(filepath.Join(workDir, "consul"))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer consul.stop()
	return m.Run()
}

func consulBinary() (string, error) {
	if p := os.Getenv("OASIS_CONSUL_BIN"); p != "" {
		return p, nil
	}
	root, err := testbed.RepoRoot()
	if err != nil {
		return "", err
	}
	p := filepath.Join(root, "bin", "consul")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("consul binary not found at %s (run `make hashistack` or set OASIS_CONSUL_BIN): %w", p, err)
	}
	return p, nil
}

// agent is one `consul agent -dev` process.
type agent struct {
	cmd    *exec.Cmd
	addr   string
	client *consulapi.Client
	done   chan struct{}
	log    string
}

func startConsul(dir string) (*agent, error) {
	bin, err := consulBinary()
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	ports, err := testutil.FreePorts(4)
	if err != nil {
		return nil, err
	}
	cfg, _ := json.Marshal(map[string]any{
		"node_name": "router-it", "bind_addr": "127.0.0.1", "client_addr": "127.0.0.1", "log_level": "warn",
		"ports": map[string]int{"http": ports[0], "serf_lan": ports[1], "serf_wan": ports[2], "server": ports[3],
			"dns": -1, "grpc": -1, "grpc_tls": -1, "https": -1},
	})
	cfgPath := filepath.Join(dir, "consul.json")
	if err := os.WriteFile(cfgPath, cfg, 0o644); err != nil {
		return nil, err
	}
	a := &agent{addr: "127.0.0.1:" + strconv.Itoa(ports[0]), done: make(chan struct{}), log: filepath.Join(dir, "consul.log")}
	logf, err := os.Create(a.log)
	if err != nil {
		return nil, err
	}
	a.cmd = exec.Command(bin, "agent", "-dev", "-config-file="+cfgPath)
	a.cmd.Stdout, a.cmd.Stderr = logf, logf
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := a.cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("starting consul: %w", err)
	}
	go func() { _ = a.cmd.Wait(); logf.Close(); close(a.done) }()
	cc := consulapi.DefaultConfig()
	cc.Address = a.addr
	a.client, _ = consulapi.NewClient(cc)
	deadline := time.Now().Add(30 * time.Second)
	for {
		if leader, err := a.client.Status().Leader(); err == nil && leader != "" {
			return a, nil
		}
		select {
		case <-a.done:
			out, _ := os.ReadFile(a.log)
			return nil, fmt.Errorf("consul exited at start:\n%s", out)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			a.stop()
			return nil, fmt.Errorf("consul had no leader after 30s")
		}
	}
}

func (a *agent) stop() {
	if a.cmd.Process == nil {
		return
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-a.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-a.cmd.Process.Pid, syscall.SIGKILL)
		<-a.done
	}
}

// sim is one oasis-sim process.
type sim struct{ *testutil.Sim }

// startSim runs oasis-sim serving model on a free port and waits for /health.
func startSim(t *testing.T, model string, extra ...string) *sim {
	t.Helper()
	return &sim{testutil.StartSim(t, testutil.SimConfig{Bin: simBin, Model: model,
		Args: append([]string{"--log-level", "warn"}, extra...)})}
}

// register adds the sim to Consul as an oasis-engine instance with a TTL
// check, passing from the start.
func register(t *testing.T, c *consulapi.Client, id, model string, s *sim) {
	t.Helper()
	host, portS, _ := net.SplitHostPort(s.Addr)
	port, _ := strconv.Atoi(portS)
	err := c.Agent().ServiceRegister(&consulapi.AgentServiceRegistration{
		ID: id, Name: "oasis-engine", Address: host, Port: port,
		Tags: []string{"oasis", "engine-sim", "role-both"},
		Meta: map[string]string{"oasis_model": model, "oasis_engine": "sim", "oasis_role": "both",
			"oasis_metrics_path": "/metrics", "oasis_block_size": "16", "oasis_node": "node-" + id},
		Check: &consulapi.AgentServiceCheck{CheckID: "ttl-" + id, TTL: "10m", Status: consulapi.HealthPassing},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Agent().ServiceDeregister(id) })
}
