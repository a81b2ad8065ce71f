package testutil

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
)

// ConsulBinary finds a real consul: $OASIS_CONSUL_BIN, the repository's
// bin/consul (make hashistack), or PATH; "" when there is none.
func ConsulBinary() string {
	if p := os.Getenv("OASIS_CONSUL_BIN"); p != "" {
		return p
	}
	if dir, err := os.Getwd(); err == nil {
		for {
			p := filepath.Join(dir, "bin", "consul")
			if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
				if _, err := os.Stat(p); err == nil {
					return p
				}
				break // the module's root, without bin/consul
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	p, _ := exec.LookPath("consul")
	return p
}

// SkipUnlessCI skips the test, or fails it under CI (CI set), where every
// test must run.
func SkipUnlessCI(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("CI") != "" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// consulBin is ConsulBinary, or the end of a test that has none.
func consulBin(t testing.TB) string {
	t.Helper()
	bin := ConsulBinary()
	if bin == "" {
		SkipUnlessCI(t, "no consul binary: set OASIS_CONSUL_BIN or run make hashistack (bin/consul)")
	}
	return bin
}

// StartConsul runs a Consul dev agent on free loopback ports (no DNS or
// gRPC) for the duration of the test, waits for its leader, and returns a
// client and its HTTP address. Without a consul binary the test is skipped
// (failed under CI).
func StartConsul(t testing.TB) (*consulapi.Client, string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		ports, err := FreePorts(4)
		must.NoError(t, err)
		a := startConsulAgent(t, consulAgentConfig{name: "dev", http: ports[0], serfLAN: ports[1], server: ports[2],
			extra: map[string]any{"ports": map[string]int{"serf_wan": ports[3]}}}, "-dev")
		// A free port can be taken by another process between FreePorts and
		// the agent's bind: start over on new ports, twice at most.
		EventuallyEvery(t, 30*time.Second, 100*time.Millisecond, "consul dev: a leader", func() bool { return a.Exited() || a.hasLeader() })
		if !a.Exited() {
			return a.Client, a.HTTPAddr
		}
		err = a.Stop()
		if attempt < 3 && strings.Contains(a.Output(), "address already in use") {
			t.Logf("consul dev lost a port to another process at start; starting it again on new ports")
			continue
		}
		t.Fatalf("consul dev exited at start: %v", err)
	}
}

func (a *ConsulAgent) hasLeader() bool {
	leader, err := a.Client.Status().Leader()
	return err == nil && leader != ""
}

// ConsulAgent is a Consul agent process a test started: a server of a
// ConsulCluster or a client agent.
type ConsulAgent struct {
	*Process
	// Name is its node name.
	Name string
	// HTTPAddr is its HTTP API's address, 127.0.0.1:port: what routers and
	// engines talk to.
	HTTPAddr string
	// SerfLANAddr is the address other agents join it on.
	SerfLANAddr string
	// ServerAddr is a server's RPC address, as Status().Leader() and
	// Status().Peers() name it; "" for a client agent.
	ServerAddr string
	// Client talks to its HTTP API.
	Client *consulapi.Client
}

// consulAgentConfig is what differs between the agents a test starts; the
// rest of their configuration is startConsulAgent's.
type consulAgentConfig struct {
	name                  string
	http, serfLAN, server int
	extra                 map[string]any // more top-level settings; "ports" merges with the above
}

// startConsulAgent runs one consul agent on loopback with a data directory
// of the test's, no DNS, gRPC, HTTPS or update check, and returns without
// waiting for it. The process is stopped (by its pid) when the test ends.
func startConsulAgent(t testing.TB, c consulAgentConfig, args ...string) *ConsulAgent {
	t.Helper()
	bin := consulBin(t)
	dir := t.TempDir() // before Start, so that it is removed after the agent stopped
	ports := map[string]int{"http": c.http, "serf_lan": c.serfLAN, "server": c.server,
		"dns": -1, "grpc": -1, "grpc_tls": -1, "https": -1}
	cfg := map[string]any{"node_name": c.name, "data_dir": filepath.Join(dir, "data"), "bind_addr": "127.0.0.1",
		"client_addr": "127.0.0.1", "log_level": "warn", "disable_update_check": true}
	for k, v := range c.extra {
		if more, ok := v.(map[string]int); ok && k == "ports" {
			for p, n := range more {
				ports[p] = n
			}
			continue
		}
		cfg[k] = v
	}
	cfg["ports"] = ports
	data, err := json.Marshal(cfg)
	must.NoError(t, err)
	path := filepath.Join(dir, "consul.json")
	must.NoError(t, os.WriteFile(path, data, 0o644))
	a := &ConsulAgent{Name: c.name, HTTPAddr: loopback(c.http), SerfLANAddr: loopback(c.serfLAN)}
	if srv, _ := cfg["server"].(bool); srv {
		a.ServerAddr = loopback(c.server)
	}
	cc := consulapi.DefaultConfig()
	cc.Address = a.HTTPAddr
	a.Client, err = consulapi.NewClient(cc)
	must.NoError(t, err)
	a.Process = Start(t, exec.Command(bin, append(append([]string{"agent"}, args...), "-config-file="+path)...))
	return a
}

func loopback(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }

// waitFor fails the test unless cond holds within timeout, and at once if
// the agent exits meanwhile (a bad configuration, a port taken).
func (a *ConsulAgent) waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	EventuallyEvery(t, timeout, 100*time.Millisecond, "consul "+a.Name+": "+what, func() bool { return a.Exited() || cond() })
	if a.Exited() {
		t.Fatalf("consul %s exited while waiting for %s: %v", a.Name, what, a.Stop())
	}
}

// ConsulCluster is a real Consul datacenter of server agents: server mode
// (not -dev, which is a single server with its state in memory), each with
// its own data directory and loopback ports, joined to each other, with the
// fastest Raft timings Consul allows so that a lost leader is replaced in
// seconds.
type ConsulCluster struct {
	Servers []*ConsulAgent
}

// StartConsulCluster runs n Consul servers (bootstrap_expect n) for the
// duration of the test and waits until they agree on a leader and the
// leader has put every server in the catalog. Without a consul binary the
// test is skipped (failed under CI).
func StartConsulCluster(t testing.TB, n int) *ConsulCluster {
	t.Helper()
	consulBin(t)
	for attempt := 1; ; attempt++ {
		c, bad := startConsulCluster(t, n)
		if bad == nil {
			return c
		}
		// A free port can be taken by another process between FreePorts
		// and the agent's bind: start over on new ports, twice at most.
		err := bad.Stop()
		if attempt < 3 && strings.Contains(bad.Output(), "address already in use") {
			for _, s := range c.Servers {
				_ = s.Stop()
			}
			t.Logf("consul %s lost a port to another process at start; starting the cluster again on new ports", bad.Name)
			continue
		}
		t.Fatalf("consul %s exited at start: %v", bad.Name, err)
	}
}

// startConsulCluster starts the servers and waits for their leader, or
// returns the first server that exited at start.
func startConsulCluster(t testing.TB, n int) (*ConsulCluster, *ConsulAgent) {
	t.Helper()
	ports, err := FreePorts(3 * n) // http, serf_lan, server each
	must.NoError(t, err)
	join := make([]string, n)
	for i := range n {
		join[i] = loopback(ports[3*i+1])
	}
	c := &ConsulCluster{}
	for i := range n {
		c.Servers = append(c.Servers, startConsulAgent(t, consulAgentConfig{
			name: "server-" + strconv.Itoa(i), http: ports[3*i], serfLAN: ports[3*i+1], server: ports[3*i+2],
			extra: map[string]any{"server": true, "bootstrap_expect": n, "retry_join": join, "retry_interval": "1s",
				"ports": map[string]int{"serf_wan": -1},
				// 1, the lowest, gives Raft heartbeat and election timeouts of
				// 1 s (the default, 5, is meant for the smallest machines).
				"performance": map[string]int{"raft_multiplier": 1}},
		}))
	}
	// A server that exits at start (a port taken meanwhile, a bad setting)
	// ends the wait at once.
	exited := func() *ConsulAgent {
		for _, s := range c.Servers {
			if s.Exited() {
				return s
			}
		}
		return nil
	}
	ready := func() bool {
		l := c.Leader()
		if l == nil {
			return false
		}
		nodes, _, err := l.Client.Catalog().Nodes(nil)
		return err == nil && len(nodes) == n
	}
	EventuallyEvery(t, 60*time.Second, 100*time.Millisecond, "the Consul servers to elect a leader and list each other", func() bool { return exited() != nil || ready() })
	return c, exited()
}

// Join returns the addresses agents join the cluster on.
func (c *ConsulCluster) Join() []string {
	out := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		out[i] = s.SerfLANAddr
	}
	return out
}

// Leader returns the server that every running server names as the leader,
// or nil while they name none, disagree, or name one that has exited (as
// they do until they notice a killed leader is gone).
func (c *ConsulCluster) Leader() *ConsulAgent {
	var leader string
	for _, s := range c.Servers {
		if s.Exited() {
			continue
		}
		addr, err := s.Client.Status().Leader()
		if err != nil || addr == "" || (leader != "" && addr != leader) {
			return nil
		}
		leader = addr
	}
	for _, s := range c.Servers {
		if s.ServerAddr == leader && !s.Exited() {
			return s
		}
	}
	return nil
}

// WaitLeader waits up to timeout for a leader the running servers agree on,
// and returns it.
func (c *ConsulCluster) WaitLeader(t testing.TB, timeout time.Duration) *ConsulAgent {
	t.Helper()
	var leader *ConsulAgent
	EventuallyEvery(t, timeout, 20*time.Millisecond, "a Consul leader", func() bool {
		leader = c.Leader()
		return leader != nil
	})
	return leader
}

// StartConsulClient runs a Consul client agent joined to the cluster, with
// its HTTP API on 127.0.0.1:httpPort (0: a free port), for the duration of
// the test, and waits until it reaches the servers and the leader has put
// it in the catalog. A node's services register with its client agent, and
// a router on the node talks to it: this is the agent production routers
// use.
func StartConsulClient(t testing.TB, c *ConsulCluster, name string, httpPort int) *ConsulAgent {
	t.Helper()
	ports, err := FreePorts(3)
	must.NoError(t, err)
	if httpPort == 0 {
		httpPort = ports[2]
	}
	a := startConsulAgent(t, consulAgentConfig{name: name, http: httpPort, serfLAN: ports[0], server: ports[1],
		extra: map[string]any{"retry_join": c.Join(), "retry_interval": "1s"}})
	a.waitFor(t, 30*time.Second, "the servers", func() bool {
		leader, err := a.Client.Status().Leader()
		if err != nil || leader == "" {
			return false
		}
		node, _, err := a.Client.Catalog().Node(name, nil)
		return err == nil && node != nil
	})
	return a
}

// StartConsulWAN runs two Consul dev agents WAN-federated on loopback,
// datacenters dc1 (primary) and dc2, for the duration of the test, and
// waits until each has a leader and lists both datacenters, so `?dc=`
// queries work from either side. Without a consul binary the test is
// skipped (failed under CI).
func StartConsulWAN(t testing.TB) (dc1, dc2 *ConsulAgent) {
	t.Helper()
	return startConsulWAN(t, false)
}

// ConsulWANManagementToken is the management token of StartConsulWANACL's
// datacenters.
const ConsulWANManagementToken = "6f1d2a0c-0a5e-4c52-9d7e-0a5e1c0ffee1"

// StartConsulWANACL is StartConsulWAN with ACLs on, default deny: dc1 owns
// them (ConsulWANManagementToken is its initial management token and both
// agents' token), dc2 replicates policies and global tokens from it. The
// agents' clients use the management token. It returns once dc2 has
// replicated tokens.
func StartConsulWANACL(t testing.TB) (dc1, dc2 *ConsulAgent) {
	t.Helper()
	return startConsulWAN(t, true)
}

func startConsulWAN(t testing.TB, acls bool) (dc1, dc2 *ConsulAgent) {
	t.Helper()
	consulBin(t)
	ports, err := FreePorts(8) // http, serf_lan, server, serf_wan each
	must.NoError(t, err)
	agent := func(dc string, p []int, extra map[string]any) *ConsulAgent {
		extra["datacenter"], extra["primary_datacenter"] = dc, "dc1"
		extra["ports"] = map[string]int{"serf_wan": p[3]}
		tokens := map[string]string{"agent": ConsulWANManagementToken}
		if dc == "dc1" {
			tokens["initial_management"] = ConsulWANManagementToken
		} else {
			tokens["replication"] = ConsulWANManagementToken
		}
		if acls {
			extra["acl"] = map[string]any{"enabled": true, "default_policy": "deny", "enable_token_replication": dc != "dc1", "tokens": tokens}
		}
		a := startConsulAgent(t, consulAgentConfig{name: "consul-" + dc, http: p[0], serfLAN: p[1], server: p[2], extra: extra}, "-dev")
		if acls {
			cc := consulapi.DefaultConfig()
			cc.Address, cc.Token = a.HTTPAddr, ConsulWANManagementToken
			a.Client, err = consulapi.NewClient(cc)
			must.NoError(t, err)
		}
		return a
	}
	dc1 = agent("dc1", ports[:4], map[string]any{})
	dc2 = agent("dc2", ports[4:], map[string]any{"retry_join_wan": []string{loopback(ports[3])}, "retry_interval_wan": "1s"})
	for _, a := range []*ConsulAgent{dc1, dc2} {
		a.waitFor(t, 60*time.Second, "a leader and both datacenters", func() bool {
			leader, err := a.Client.Status().Leader()
			dcs, derr := a.Client.Catalog().Datacenters()
			return err == nil && leader != "" && derr == nil && slices.Contains(dcs, "dc1") && slices.Contains(dcs, "dc2")
		})
	}
	if acls {
		// Policies replicate apart from tokens: a token dc2 has whose policies it has not yet
		// lacks every permission there.
		dc2.waitFor(t, 60*time.Second, "policy and token replication", func() bool {
			r, _, err := dc2.Client.ACL().Replication(nil)
			return err == nil && r.Running && r.ReplicatedIndex > 0 && r.ReplicatedTokenIndex > 0
		})
	}
	return dc1, dc2
}

// SetIntentions writes the service-intentions config entry of dest: the
// allow sources, then every other source denied (so the test does not hang
// on the agent's default, which follows its ACL default policy). A server
// just elected refuses intention writes until it has moved intentions to
// config entries ("Intentions are read only while being upgraded to config
// entries"), so the write is retried for a while.
func SetIntentions(t testing.TB, c *consulapi.Client, dest string, allow ...string) {
	t.Helper()
	e := &consulapi.ServiceIntentionsConfigEntry{Kind: consulapi.ServiceIntentions, Name: dest}
	for _, s := range allow {
		e.Sources = append(e.Sources, &consulapi.SourceIntention{Name: s, Action: consulapi.IntentionActionAllow})
	}
	e.Sources = append(e.Sources, &consulapi.SourceIntention{Name: "*", Action: consulapi.IntentionActionDeny})
	// ErrorFunc: a failure shows the last write's error; one that waiting
	// cannot cure fails at once.
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		_, _, err := c.ConfigEntries().Set(e, nil)
		if err != nil && !strings.Contains(err.Error(), "being upgraded to config entries") &&
			!strings.Contains(err.Error(), "No cluster leader") {
			t.Fatalf("writing the intentions of %s: %v", dest, err)
		}
		return err
	}), wait.Timeout(30*time.Second), wait.Gap(100*time.Millisecond)), must.Sprintf("writing the intentions of %s", dest))
}

// RotateConnectCA gives the Connect CA of c's cluster a new private key:
// Consul issues new roots and re-signs every service's leaf (each agent
// picks its new leaves up within about 20 s).
func RotateConnectCA(t testing.TB, c *consulapi.Client) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must.NoError(t, err)
	der, err := x509.MarshalECPrivateKey(key)
	must.NoError(t, err)
	_, err = c.Connect().CASetConfig(&consulapi.CAConfig{Provider: "consul", Config: map[string]any{
		"PrivateKey": string(pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}))}}, nil)
	must.NoError(t, err)
}
