package testbed

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/oasis-llm/oasis/internal/meshid"
	"github.com/oasis-llm/oasis/internal/testutil"
)

// Bridge networking and Consul Connect in the test bed.
//
// Production runs Envoy sidecars; Envoy cannot be installed here, so a mesh engine's sidecar is
// Consul's own L4 proxy, `consul connect proxy`, in a raw_exec sidecar_task (connectBlock says
// why not with -sidecar-for). It serves mTLS with the service's leaf certificate and authorizes
// callers by intentions, as Envoy does. Two things let it work inside the allocation's network
// namespace:
//
//   - its Consul token: with ACLs on, Nomad's sids hook writes the service identity token of the
//     parent service (oasis-engine, from the nomad-workloads service binding rule) to the sidecar
//     task's secrets/si_token (Nomad's consul_http.sock hook serves Connect native tasks only);
//   - the Consul agent: it listens on the host's loopback, which the namespace does not share,
//     so the stack also serves Consul's HTTP API on a unix socket (Stack.ConsulHTTPSocket) and
//     raw_exec, which does not isolate the file system, reaches it there.

// bridgeNet is the client's bridge network: a bridge and subnet of the stack's own, so stacks
// running at once on one machine do not share Nomad's default bridge "nomad" and its subnet.
// Nomad's client also needs Consul's gRPC port to place a Connect sidecar (startConsul).
type bridgeNet struct {
	name    string // the bridge interface
	subnet  string // CIDR the allocations' addresses come from
	cniPath string // directory of the CNI plugins
	cniConf string // cni_config_dir, empty: the stack uses no cni/* networks
}

// CNIPathEnv overrides where the test bed finds the CNI plugins (default: bin/cni of the checkout).
const CNIPathEnv = "OASIS_CNI_PATH"

// nomadDataDir is the Nomad agent's data_dir. A bridge stack's is short: Nomad creates unix
// sockets for Consul (alloc/tmp/consul_grpc.sock) in each allocation directory, and a socket
// path is at most maxSocketPath bytes.
func (s *Stack) nomadDataDir() string {
	if s.bridge != nil {
		return filepath.Join(s.Dir, "n")
	}
	return filepath.Join(s.Dir, "nomad-data")
}

// maxSocketPath is the longest unix socket path Linux binds (sun_path less its NUL).
const maxSocketPath = 107

// setupBridge checks what bridge mode needs and picks the stack's bridge name and subnet.
func (s *Stack) setupBridge() error {
	cni := os.Getenv(CNIPathEnv)
	if cni == "" {
		cni = filepath.Join(s.root, "bin", "cni")
	}
	for _, plugin := range []string{"bridge", "loopback", "host-local", "portmap", "firewall"} {
		if _, err := os.Stat(filepath.Join(cni, plugin)); err != nil {
			return fmt.Errorf("CNI plugin %s not found in %s (run `make hashistack`, or set %s): %w", plugin, cni, CNIPathEnv, err)
		}
	}
	if _, err := os.Stat(iptables()); err != nil {
		return errors.New("iptables not found: the CNI bridge and portmap plugins need it (run `make deps`)")
	}
	suffix := make([]byte, 3)
	if _, err := rand.Read(suffix); err != nil {
		return err
	}
	subnet, err := freeSubnet()
	if err != nil {
		return err
	}
	// <data_dir>/alloc/<alloc id>/alloc/tmp/consul_grpc.sock
	sock := filepath.Join(s.Dir, "n", "alloc", "00000000-0000-0000-0000-000000000000", "alloc", "tmp", "consul_grpc.sock")
	if len(sock) > maxSocketPath {
		return fmt.Errorf("stack directory %s is too long for bridge mode: Nomad's Consul socket %s would exceed %d bytes (use a shorter TMPDIR or Options.Dir)", s.Dir, sock, maxSocketPath)
	}
	conf := filepath.Join(s.Dir, "cni.d")
	if err := os.MkdirAll(conf, 0o755); err != nil {
		return err
	}
	s.bridge = &bridgeNet{name: "oasis" + hex.EncodeToString(suffix), subnet: subnet, cniPath: cni, cniConf: conf}
	s.logf("testbed: bridge networking on %s (%s), CNI plugins in %s", s.bridge.name, subnet, cni)
	return nil
}

// freeSubnet picks a /24 in 10.231.0.0/16 (far from Nomad's default 172.26.64.0/20 and from
// Docker's 172.17.0.0/16) that no interface of the machine is in.
func freeSubnet() (string, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return "", err
	}
	for range 64 {
		n, err := rand.Int(rand.Reader, big.NewInt(254))
		if err != nil {
			return "", err
		}
		_, cidr, _ := net.ParseCIDR(fmt.Sprintf("10.231.%d.0/24", n.Int64()+1))
		used := false
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok && (cidr.Contains(ipn.IP) || ipn.Contains(cidr.IP)) {
				used = true
			}
		}
		if !used {
			return cidr.String(), nil
		}
	}
	return "", errors.New("no free /24 in 10.231.0.0/16 for the bridge network")
}

// clientConfig is the Nomad client block's bridge settings; empty without a bridge.
func (b *bridgeNet) clientConfig() string {
	if b == nil {
		return ""
	}
	return fmt.Sprintf(`  cni_path              = %q
  cni_config_dir        = %q
  bridge_network_name   = %q
  bridge_network_subnet = %q
`, b.cniPath, b.cniConf, b.name, b.subnet)
}

// waitNetworksTornDown waits (bounded) until Nomad has torn down the network namespaces of the
// stack's allocations: an allocation reports terminal before its network hook runs the CNI
// DEL that removes its NAT and firewall rules, and an agent stopped in between leaves them in
// the host's iptables.
func (s *Stack) waitNetworksTornDown(timeout time.Duration) error {
	if s.bridge == nil || s.Nomad == nil {
		return nil
	}
	// The server forgets purged jobs' allocations; the client's alloc dirs name them all.
	allocs, _ := os.ReadDir(filepath.Join(s.nomadDataDir(), "alloc"))
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return poll(ctx, 100*time.Millisecond, "allocation networks torn down", func() (bool, error) {
		for _, a := range allocs {
			// Nomad names an allocation's namespace after it (nsutil.NetNSRunDir).
			if _, err := os.Stat(filepath.Join("/var/run/netns", a.Name())); err == nil {
				return false, nil
			}
		}
		return true, nil
	})
}

// remove deletes the bridge Nomad created (the CNI plugins leave it behind on purpose) and the
// firewall rule Nomad added for its subnet to NOMAD-ADMIN, which Nomad never removes.
func (b *bridgeNet) remove() error {
	if b == nil {
		return nil
	}
	if _, err := net.InterfaceByName(b.name); err != nil {
		return nil // no allocation ever used it
	}
	var errs []error
	if out, err := exec.Command("ip", "link", "delete", b.name).CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("removing bridge %s: %w: %s", b.name, err, out))
	}
	rule := []string{"-D", "NOMAD-ADMIN", "-d", b.subnet, "-o", b.name, "-j", "ACCEPT"}
	if out, err := exec.Command(iptables(), rule...).CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("removing Nomad's firewall rule for %s: %w: %s", b.name, err, out))
	}
	return errors.Join(errs...)
}

// iptables is the iptables binary, which is in /usr/sbin, not on every PATH.
func iptables() string {
	if p, err := exec.LookPath("iptables"); err == nil {
		return p
	}
	return "/usr/sbin/iptables"
}

// MeshServiceName is the Consul service a MeshSimEngine registers (as SimEngine does).
const MeshServiceName = "oasis-engine"

// MeshEnginePort is the port a MeshSimEngine's engine listens on inside its namespace (the
// http port's "to"), which its sidecar forwards to.
const MeshEnginePort = 8000

// MeshSimEngine is a SimEngine in bridge networking with a Consul Connect sidecar. Build it with
// Stack.MeshSimEngine, which fills in the stack's consul binary and socket. SimEngine's options
// apply (Provider is always "consul": Connect is Consul's); the engine's http port maps to
// MeshEnginePort inside the namespace, its kv ports keep their numbers.
type MeshSimEngine struct {
	SimEngine
	// LoopbackOnly binds the engine to 127.0.0.1 inside the namespace, so only its sidecar
	// reaches it (the mapped port answers nothing); the service's health check then runs curl
	// inside the engine task instead of an HTTP check from the Consul agent.
	LoopbackOnly bool

	consulBin, consulSocket string
}

// MeshSimEngine wraps e for the stack, which must have been started with Options.Bridge.
func (s *Stack) MeshSimEngine(e SimEngine) MeshSimEngine {
	return MeshSimEngine{SimEngine: e, consulBin: s.consulBin, consulSocket: s.ConsulHTTPSocket}
}

// MeshServiceID is the Consul service id of the engine's service in allocation allocID (Nomad
// names group services _nomad-task-<alloc>-group-<group>-<service>-<port label>); the sidecar
// registers as this id + "-sidecar-proxy".
func MeshServiceID(allocID string) string {
	return "_nomad-task-" + allocID + "-group-engine-" + MeshServiceName + "-http"
}

// HCL renders the jobspec.
func (m MeshSimEngine) HCL() string {
	m.Provider = "consul"
	if m.Config != "" && m.LoopbackOnly {
		m.Config += "\n        "
	}
	g := groupNet{mode: `mode = "bridge"`, httpTo: MeshEnginePort, connect: m.connectBlock()}
	if m.LoopbackOnly {
		m.Config += `bind_address      = "127.0.0.1"`
		g.check = fmt.Sprintf(`check {
        type     = "script"
        task     = "engine"
        command  = "/usr/bin/curl"
        args     = ["-fsS", "-o", "/dev/null", "http://127.0.0.1:%d/health"]
        interval = "1s"
        timeout  = "1s"
      }`, MeshEnginePort)
	}
	return m.render(g)
}

// connectBlock is the service's sidecar: `consul connect proxy` with the sidecar's service
// identity token and Consul's unix socket. It runs in flag mode, not -sidecar-for: for a
// sidecar, the built-in proxy binds the public listener to the registration's address and port,
// the host side of the mapping (127.0.0.1 there is the namespace's own loopback, which the
// bridge's port mapping does not reach), and it ignores the bind_address Nomad puts in the
// proxy config. So it listens on every interface of the namespace at the sidecar port, and
// forwards to the engine's in-namespace port; Nomad still registers the sidecar service that
// Connect clients discover, and checks it through the mapped port.
func (m MeshSimEngine) connectBlock() string {
	return fmt.Sprintf(`connect {
        sidecar_service {
          proxy {
            local_service_address = "127.0.0.1"
            local_service_port    = %[1]d
          }
        }
        sidecar_task {
          driver = "raw_exec"
          config {
            command = %[2]q
            args = [
              "connect", "proxy",
              "-service", %[3]q,
              "-service-addr", "127.0.0.1:%[1]d",
              "-listen", "0.0.0.0:${NOMAD_PORT_connect_proxy_%[5]s}",
              "-http-addr", "unix://%[4]s",
              "-token-file", "${NOMAD_SECRETS_DIR}/si_token",
              "-log-level", "info",
            ]
          }
          resources {
            cpu    = 100
            memory = 128
          }
        }
      }`, MeshEnginePort, m.consulBin, MeshServiceName, m.consulSocket, strings.ReplaceAll(MeshServiceName, "-", "_"))
}

// WaitConnectPassing waits until n mesh endpoints of service (sidecars or Connect-native
// instances) pass their checks.
func (s *Stack) WaitConnectPassing(ctx context.Context, service string, n int) error {
	return poll(ctx, 200*time.Millisecond, "mesh endpoints of "+service, func() (bool, error) {
		got, _, err := s.Consul.Health().Connect(service, "", true, nil)
		return err == nil && len(got) >= n, err
	})
}

// WaitMeshPassing waits until n instances of MeshServiceName and of its sidecar service pass
// their checks, and returns the engine service's entries.
func (s *Stack) WaitMeshPassing(ctx context.Context, n int) ([]*consulapi.ServiceEntry, error) {
	entries, err := s.WaitServicePassing(ctx, MeshServiceName, n)
	if err != nil {
		return nil, err
	}
	err = poll(ctx, 200*time.Millisecond, "connect sidecar of "+MeshServiceName, func() (bool, error) {
		got, _, err := s.Consul.Health().Connect(MeshServiceName, "", true, nil)
		return err == nil && len(got) >= n, err
	})
	if err != nil {
		return nil, err
	}
	return entries, nil
}

// ConnectUpstream runs a Connect client outside Nomad: `consul connect proxy -service <service>
// -upstream <MeshServiceName>:<local port>` with a token that may write service (its own
// identity, for its leaf certificate). Calls to the returned 127.0.0.1 address go to the mesh
// engine through its sidecar, over mTLS, subject to intentions. stop ends the proxy.
func (s *Stack) ConnectUpstream(ctx context.Context, service string) (addr string, stop func(), err error) {
	token, err := s.MeshClientToken(service)
	if err != nil {
		return "", nil, err
	}
	free, err := testutil.FreePorts(1)
	if err != nil {
		return "", nil, err
	}
	port := free[0]
	addr = fmt.Sprintf("127.0.0.1:%d", port)
	cmd := exec.CommandContext(ctx, s.consulBin, "connect", "proxy", "-service", service,
		"-upstream", fmt.Sprintf("%s:%d", MeshServiceName, port), "-log-level", "info")
	cmd.Env = append(s.Env(), "CONSUL_HTTP_TOKEN="+token)
	logPath := filepath.Join(s.Dir, "connect-"+service+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return "", nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return "", nil, fmt.Errorf("starting consul connect proxy: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); logFile.Close(); close(done) }()
	stop = func() {
		_ = cmd.Process.Kill()
		<-done
	}
	err = poll(ctx, 100*time.Millisecond, "connect upstream listener "+addr, func() (bool, error) {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil, nil
	})
	if err != nil {
		stop()
		data, _ := os.ReadFile(logPath)
		return "", nil, fmt.Errorf("%w\n%s", err, strings.TrimSpace(string(data)))
	}
	return addr, stop, nil
}

// MeshClientToken is a new Consul token for a mesh client that is service: write on it (its
// leaf certificate), read on the others and on nodes (to find them). The policy is made once per
// service.
func (s *Stack) MeshClientToken(service string) (string, error) {
	name := "connect-client-" + service
	if p, _, err := s.Consul.ACL().PolicyReadByName(name, nil); err == nil && p != nil {
		t, _, err := s.Consul.ACL().TokenCreate(&consulapi.ACLToken{Description: name,
			Policies: []*consulapi.ACLTokenPolicyLink{{ID: p.ID}}}, nil)
		if err != nil {
			return "", fmt.Errorf("creating consul token %s: %w", name, err)
		}
		return t.SecretID, nil
	}
	return s.consulPolicyToken(name, fmt.Sprintf(`service %q {
  policy = "write"
}
service_prefix "" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}`, service))
}

// ApplyIntentions runs jobs/mesh/apply.sh with the management token, as an operator would.
func (s *Stack) ApplyIntentions(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(s.root, "jobs", "mesh", "apply.sh"))
	cmd.Env = append(s.Env(), "CONSUL="+s.consulBin)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("jobs/mesh/apply.sh: %w: %s", err, out)
	}
	return nil
}

// SetIntention writes the service-intentions config entry of MeshServiceName with `consul
// config write` and the management token, as an operator does: action ("allow" or "deny") for
// calls from source. Sidecars authorize each new connection against it.
func (s *Stack) SetIntention(ctx context.Context, source, action string) error {
	entry := fmt.Sprintf(`Kind = "service-intentions"
Name = %q
Sources = [
  {
    Name   = %q
    Action = %q
  }
]
`, MeshServiceName, source, action)
	cmd := exec.CommandContext(ctx, s.consulBin, "config", "write", "-")
	cmd.Env, cmd.Stdin = s.Env(), strings.NewReader(entry)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("consul config write (%s -> %s %s): %w: %s", source, MeshServiceName, action, err, out)
	}
	return nil
}

// MeshVariables are the variables a mesh recipe (recipes/*/*/agg-mesh) takes to run on this
// stack without Envoy: Consul's built-in proxy as the sidecar, reaching the agent on its unix
// socket. Files that do not declare them ignore them (RunJobFile, ParseJobFile).
func (s *Stack) MeshVariables() map[string]string {
	return map[string]string{"sidecar": "consul", "consul_bin": s.consulBin, "consul_http_addr": "unix://" + s.ConsulHTTPSocket}
}

// BridgeName is the stack's bridge interface ("" without Options.Bridge).
func (s *Stack) BridgeName() string {
	if s.bridge == nil {
		return ""
	}
	return s.bridge.name
}

// MeshIdentity is a Connect identity for service from the stack's agent, with a token of
// MeshClientToken's (write on service, nothing more). Close it when done.
func (s *Stack) MeshIdentity(ctx context.Context, service string) (*meshid.Identity, error) {
	token, err := s.MeshClientToken(service)
	if err != nil {
		return nil, err
	}
	c, err := newConsulClient(s.ConsulAddr, token)
	if err != nil {
		return nil, err
	}
	return meshid.New(ctx, meshid.Config{Consul: c, Service: service})
}
