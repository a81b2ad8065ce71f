package testbed

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"
	"github.com/oasis-llm/oasis/internal/testutil"
)

func (s *Stack) startConsul(ctx context.Context) error {
	ports, err := testutil.FreePorts(5)
	if err != nil {
		return err
	}
	http, serfLAN, serfWAN, server := ports[0], ports[1], ports[2], ports[3]
	grpc := -1
	if s.bridge != nil {
		// Nomad places a Connect sidecar only on a client whose Consul serves gRPC
		// (attr.consul.grpc > 0), which the sidecar hook hands to Envoy.
		grpc = ports[4]
	}
	config := map[string]any{
		"node_name":   "oasis-testbed",
		"bind_addr":   "127.0.0.1",
		"client_addr": "127.0.0.1",
		"log_level":   "warn",
		// grpc_tls off: a dev agent takes 8503 for it otherwise, and a second agent on the
		// machine then fails to start.
		"ports": map[string]int{
			"http": http, "serf_lan": serfLAN, "serf_wan": serfWAN, "server": server,
			"dns": -1, "grpc": grpc, "grpc_tls": -1, "https": -1,
		},
	}
	if s.acls {
		config["acl"] = consulACLConfig()
	}
	if s.bridge != nil {
		s.ConsulHTTPSocket = filepath.Join(s.Dir, "consul-http.sock")
		config["addresses"] = map[string]string{"http": "127.0.0.1 unix://" + s.ConsulHTTPSocket}
	}
	s.consulSerfWAN = fmt.Sprintf("127.0.0.1:%d", serfWAN)
	if s.fed != nil {
		s.fed.consulConfig(config)
	}
	data, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding consul config: %w", err)
	}
	path := filepath.Join(s.Dir, "consul.json")
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing consul config: %w", err)
	}
	s.ConsulAddr = fmt.Sprintf("127.0.0.1:%d", http)
	s.consul, err = startProcess(s.consulBin, []string{"agent", "-dev", "-config-file=" + path}, filepath.Join(s.Dir, "consul.log"))
	if err != nil {
		return err
	}
	if s.Consul, err = newConsulClient(s.ConsulAddr, ""); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = poll(ctx, 100*time.Millisecond, "consul leader", func() (bool, error) {
		if s.consul.exited() {
			return false, s.exitedError("consul", "consul.log")
		}
		leader, err := s.Consul.Status().Leader()
		return err == nil && leader != "", err
	})
	switch {
	case err != nil || !s.acls:
	case s.fed != nil && !s.fed.primary():
		// A secondary has no ACL system of its own to bootstrap: it replicates the primary's.
		err = s.waitConsulReplication(ctx)
	default:
		err = s.bootstrapConsulACL(ctx)
	}
	if err != nil {
		return fmt.Errorf("%w\nconsul log:\n%s", err, s.tail("consul.log"))
	}
	s.logf("testbed: consul ready at %s (ACLs %s)", s.ConsulAddr, onOff(s.acls))
	return nil
}

func (s *Stack) writeNomadConfig(opts Options) error {
	ports, err := testutil.FreePorts(3)
	if err != nil {
		return err
	}
	http, rpc, serf := ports[0], ports[1], ports[2]
	s.NomadAddr = fmt.Sprintf("http://127.0.0.1:%d", http)
	s.nomadSerf = fmt.Sprintf("127.0.0.1:%d", serf)
	if s.ports == nil {
		if s.ports, err = dynamicPortWindows().Claim(); err != nil {
			return fmt.Errorf("claiming the Nomad client's dynamic ports: %w", err)
		}
	}
	name, top, server, client, acl := "oasis-testbed", "", "", nomadDynamicPorts(s.ports), ""
	if s.fed != nil {
		name = "oasis-testbed-" + s.Datacenter
		top, server, acl = s.fed.nomadConfig()
	}
	llmConfig := opts.LLMPluginConfig
	if llmConfig == "" {
		llmConfig = fmt.Sprintf("binaries = { sim = %q }", s.Bin("oasis-sim"))
	}
	if opts.LLMPluginExtra != "" {
		llmConfig += "\n    " + opts.LLMPluginExtra
	}
	aclConfig := ""
	if s.acls {
		aclConfig = s.nomadConsulACLConfig()
	}
	var plugins strings.Builder
	if s.hasPlugin("nomad-driver-llm") {
		fmt.Fprintf(&plugins, "plugin \"nomad-driver-llm\" {\n  config {\n    %s\n  }\n}\n", llmConfig)
	}
	if s.hasPlugin("nomad-device-gpu") {
		plugins.WriteString("plugin \"nomad-device-gpu\" {\n  config {}\n}\n")
	}
	extra := slices.Sorted(maps.Keys(opts.ExtraPlugins))
	for _, name := range extra {
		if err := copyFile(opts.ExtraPlugins[name], filepath.Join(s.PluginDir, name)); err != nil {
			return fmt.Errorf("installing plugin %s: %w", name, err)
		}
		fmt.Fprintf(&plugins, "plugin %q {\n  config {}\n}\n", name)
	}
	config := fmt.Sprintf(`name       = %[11]q
%[12]sdata_dir   = %[1]q
plugin_dir = %[2]q
bind_addr  = "127.0.0.1"
log_level  = "DEBUG"

ports {
  http = %[3]d
  rpc  = %[4]d
  serf = %[5]d
}

advertise {
  http = "127.0.0.1:%[3]d"
  rpc  = "127.0.0.1:%[4]d"
  serf = "127.0.0.1:%[5]d"
}

server {
  enabled          = true
  bootstrap_expect = 1
%[13]s}

client {
  enabled           = true
  servers           = ["127.0.0.1:%[4]d"]
  network_interface = "lo"
  options = {
    # AWS_CA_BUNDLE in this environment breaks the cloud fingerprinters (NOTES §3).
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }
  # The host's disk is not the stack's: past Nomad's default of 80 percent the client garbage-collects a
  # finished allocation, and the logs a test reads from it, the moment it ends.
  gc_disk_usage_threshold  = 99
  gc_inode_usage_threshold = 99
%[14]s%[16]s}

consul {
  address = %[6]q
%[9]s}

acl {
  enabled = %[10]t
%[15]s}

# Every client of the stack, the tests' own included, comes from 127.0.0.1: Nomad's default of 100
# concurrent HTTP connections per client address answered a log read 429 while a test polled.
limits {
  http_max_conns_per_client = 0
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}

# /v1/metrics?format=prometheus, which the shipped Prometheus configuration scrapes
# (observability/prometheus.yml, job nomad).
telemetry {
  prometheus_metrics         = true
  publish_allocation_metrics = true
  publish_node_metrics       = true
}

%[7]s
%[8]s
`, s.nomadDataDir(), s.PluginDir, http, rpc, serf, s.ConsulAddr, plugins.String(), opts.NomadConfig, aclConfig, s.acls,
		name, top, server, client, acl, s.bridge.clientConfig())
	s.nomadConfig = filepath.Join(s.Dir, "nomad.hcl")
	// It holds the agent's Consul token.
	if err := os.WriteFile(s.nomadConfig, []byte(config), 0o600); err != nil {
		return fmt.Errorf("writing nomad config: %w", err)
	}
	// A secondary region starts with the primary's management token, which it replicates.
	s.Nomad, err = newNomadClient(s.NomadAddr, s.NomadToken)
	return err
}

func newNomadClient(addr, token string) (*nomadapi.Client, error) {
	cfg := nomadapi.DefaultConfig()
	cfg.Address, cfg.SecretID = addr, token
	c, err := nomadapi.NewClient(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating nomad client: %w", err)
	}
	return c, nil
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func (s *Stack) startNomad(ctx context.Context, opts Options) error {
	if err := s.writeNomadConfig(opts); err != nil {
		return err
	}
	return s.launchNomad(ctx)
}

// launchNomad starts the agent on the existing configuration and data dir and waits for a
// leader and a ready client node with a healthy raw_exec driver (and the llm driver detected,
// when its plugin is installed).
func (s *Stack) launchNomad(ctx context.Context) error {
	var err error
	// Nomad's Connect sidecar hook runs `consul connect envoy -bootstrap` from its PATH, and
	// the bridge's NAT rules need iptables (in /usr/sbin, not on every PATH).
	path := "PATH=" + filepath.Dir(s.consulBin) + ":" + os.Getenv("PATH") + ":/usr/sbin:/sbin"
	s.nomad, err = startProcess(s.nomadBin, []string{"agent", "-config=" + s.nomadConfig}, filepath.Join(s.Dir, "nomad.log"), path)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 90*time.Second)
	defer cancel()
	if s.acls && s.NomadToken == "" {
		if err := s.bootstrapNomadACL(ctx); err != nil {
			return fmt.Errorf("%w\nnomad log:\n%s", err, s.tail("nomad.log"))
		}
	}
	err = poll(ctx, 200*time.Millisecond, "nomad client node ready", func() (bool, error) {
		if s.nomad.exited() {
			return false, s.exitedError("nomad", "nomad.log")
		}
		// "keyring has not been initialized" and similar errors are transient right after start.
		nodes, _, err := s.Nomad.Nodes().List(nil)
		if err != nil {
			return false, err
		}
		for _, n := range nodes {
			if n.Status != "ready" {
				continue
			}
			if d := n.Drivers["raw_exec"]; d == nil || !d.Healthy {
				return false, nil
			}
			if s.hasPlugin("nomad-driver-llm") {
				if d := n.Drivers["llm"]; d == nil || !d.Detected {
					return false, nil
				}
			}
			s.NodeID = n.ID
			return true, nil
		}
		return false, nil
	})
	if err != nil {
		return fmt.Errorf("%w\nnomad log:\n%s", err, s.tail("nomad.log"))
	}
	s.logf("testbed: nomad ready at %s (node %s)", s.NomadAddr, s.NodeID)
	return nil
}

// RestartNomad stops the Nomad agent and starts it again on the same data dir. Tasks keep
// running across the restart (their supervisors are separate processes); the client recovers them.
func (s *Stack) RestartNomad(ctx context.Context) error {
	if err := stopProcess(s.nomad, 30*time.Second); err != nil {
		return fmt.Errorf("stopping nomad: %w", err)
	}
	// Keep the first run's log for diagnosis.
	if data, err := os.ReadFile(filepath.Join(s.Dir, "nomad.log")); err == nil {
		f, ferr := os.OpenFile(filepath.Join(s.Dir, "nomad-previous.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if ferr == nil {
			f.Write(data)
			f.Close()
		}
	}
	return s.launchNomad(ctx)
}

// NomadLog returns the last lines of the Nomad agent's log, for test failure messages.
func (s *Stack) NomadLog() string { return s.tail("nomad.log") }

func (s *Stack) tail(name string) string {
	data, err := os.ReadFile(filepath.Join(s.Dir, name))
	if err != nil {
		return fmt.Sprintf("(no %s: %v)", name, err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > 60 {
		lines = lines[len(lines)-60:]
	}
	return strings.Join(lines, "\n")
}
