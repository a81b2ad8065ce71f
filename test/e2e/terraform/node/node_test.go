package node

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/shoenig/test/must"
	"github.com/shoenig/test/wait"
	"go.yaml.in/yaml/v3"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tofutest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

const (
	nodeName = "oasis-gpu-e2e"
	nodePool = "gpu-e2e"
)

// release builds a tarball of the node's commands with scripts/dist.sh (host architecture only)
// and serves its directory over HTTP, as a release download would be. It returns the tarball's
// URL and its SHA-256 read from SHA256SUMS.
func release(t *testing.T, root string) (url, sum string) {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(filepath.Join(root, "scripts", "dist.sh"))
	cmd.Env = append(os.Environ(), "OASIS_VERSION=e2e", "DIST_ARCHES="+runtime.GOARCH,
		"DIST_CMDS=nomad-driver-llm nomad-device-gpu oasis-sim", "DIST_DIR="+dir)
	out, err := cmd.CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	sums, err := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	must.NoError(t, err)
	fields := strings.Fields(string(sums))
	must.SliceLen(t, 2, fields)
	srv := httptest.NewServer(http.FileServer(http.Dir(dir)))
	t.Cleanup(srv.Close)
	return srv.URL + "/" + fields[1], fields[0]
}

// cloudConfig is the part of the module's #cloud-config user-data a node acts on.
type cloudConfig struct {
	WriteFiles []struct {
		Path        string `yaml:"path"`
		Permissions string `yaml:"permissions"`
		Content     string `yaml:"content"`
	} `yaml:"write_files"`
	RunCmd [][]string `yaml:"runcmd"`
}

// writeFiles does what cloud-init's write_files does with the module's user-data: each file with
// its mode. It returns the paths written.
func writeFiles(t *testing.T, userData string) []string {
	t.Helper()
	must.StrHasPrefix(t, "#cloud-config\n", userData)
	var cc cloudConfig
	must.NoError(t, yaml.Unmarshal([]byte(userData), &cc))
	var paths []string
	for _, f := range cc.WriteFiles {
		mode, err := strconv.ParseUint(f.Permissions, 8, 32)
		must.NoError(t, err)
		must.NoError(t, os.MkdirAll(filepath.Dir(f.Path), 0o755))
		must.NoError(t, os.WriteFile(f.Path, []byte(f.Content), os.FileMode(mode)))
		must.NoError(t, os.Chmod(f.Path, os.FileMode(mode)))
		paths = append(paths, f.Path)
	}
	return paths
}

// node is one rendering of the module for a node living under dir.
type node struct {
	dir                             string
	nomadPorts, consulPorts         []int
	consulJoin, nomadServer         string
	consulAgentToken, nomadConsulTk string
}

func (n node) vars(url, sum string) []string {
	p := func(elem ...string) string { return filepath.Join(append([]string{n.dir}, elem...)...) }
	v := map[string]string{
		"oasis_release_url":       url,
		"oasis_release_sha256":    sum,
		"allow_insecure_download": "true",
		"install_prefix":          p("prefix"),
		"install_script_path":     p("sbin", "oasis-install.sh"),
		"node_name":               nodeName,
		"datacenter":              stack.Datacenter,
		"region":                  stack.Region,
		"node_pool":               nodePool,
		"node_class":              "e2e-sim",
		"meta":                    `{ "oasis.provisioned_by" = "nomad-gpu-client" }`,
		"nomad_servers":           fmt.Sprintf("[%q]", n.nomadServer),
		"nomad_data_dir":          p("nomad", "data"),
		"nomad_plugin_dir":        p("nomad", "plugins"),
		"nomad_config_dir":        p("nomad.d"),
		"nomad_bind_addr":         "127.0.0.1",
		"nomad_advertise_addr":    "127.0.0.1",
		"nomad_ports":             fmt.Sprintf("{ http = %d, rpc = %d, serf = %d }", n.nomadPorts[0], n.nomadPorts[1], n.nomadPorts[2]),
		"nomad_network_interface": "lo",
		// Disjoint from the stack's client (20000-32000): both hand out ports on 127.0.0.1.
		"nomad_dynamic_ports":  "{ min = 62000, max = 62999 }", // above the stacks' windows and the kernel's ephemeral ports
		"nomad_client_options": `{ "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean" }`,
		"nomad_log_level":      "DEBUG",
		"nomad_consul_token":   n.nomadConsulTk,
		"kvcached_dir":         p("kvcached"),
		"consul_retry_join":    fmt.Sprintf("[%q]", n.consulJoin),
		"consul_config_dir":    p("consul.d"),
		"consul_data_dir":      p("consul", "data"),
		"consul_bind_addr":     "127.0.0.1",
		"consul_client_addr":   "127.0.0.1",
		"consul_ports":         fmt.Sprintf("{ http = %d, serf_lan = %d, dns = -1, grpc = -1 }", n.consulPorts[0], n.consulPorts[1]),
		"consul_agent_token":   n.consulAgentToken,
	}
	var args []string
	for k, val := range v {
		args = append(args, "-var", k+"="+val)
	}
	return args
}

// TestNodeModuleProvisionsANomadClient applies the node module, installs the release with its
// install script (a wrong checksum installs nothing), runs its Consul and Nomad client
// configurations as real agents, and runs the sim recipe on the new node.
func TestNodeModuleProvisionsANomadClient(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)

	// Tasks may run as other users: the node's tree must be traversable (t.TempDir is 0700).
	dir, err := os.MkdirTemp("", "oasis-node-e2e-")
	must.NoError(t, err)
	must.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() {
		if os.Getenv("OASIS_TESTBED_KEEP") == "" {
			os.RemoveAll(dir)
		}
	})

	start := time.Now()
	url, sum := release(t, root)
	t.Logf("release tarball built and served in %s", time.Since(start).Round(time.Millisecond))

	n := node{dir: dir}
	n.nomadPorts, err = testutil.FreePorts(3)
	must.NoError(t, err)
	n.consulPorts, err = testutil.FreePorts(2)
	must.NoError(t, err)
	n.nomadServer, err = stack.NomadServerRPC()
	must.NoError(t, err)
	n.consulJoin, err = stack.ConsulSerfLAN()
	must.NoError(t, err)
	n.consulAgentToken, n.nomadConsulTk, err = stack.ClientTokens()
	must.NoError(t, err)
	must.NotEq(t, "", n.consulAgentToken, must.Sprint("the stack runs with ACLs: the node needs tokens"))

	tf := tofutest.New(t, tofutest.Options{Module: filepath.Join(root, "terraform", "modules", "nomad-gpu-client")})
	tf.Init(ctx)

	// A checksum that does not match: the script refuses the tarball and installs nothing.
	wrong := sha256.Sum256([]byte("not the release"))
	tf.Must(ctx, append([]string{"apply", "-auto-approve", "-no-color"}, n.vars(url, hex.EncodeToString(wrong[:]))...)...)
	var script string
	must.NoError(t, tf.Output(ctx, "install_script", &script))
	bad := filepath.Join(t.TempDir(), "install-wrong-sum.sh")
	must.NoError(t, os.WriteFile(bad, []byte(script), 0o755))
	out, err := exec.CommandContext(ctx, "/bin/bash", bad).CombinedOutput()
	must.Error(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "checksum mismatch")
	for _, d := range []string{"prefix", "nomad", "kvcached"} {
		_, err := os.Stat(filepath.Join(dir, d))
		must.True(t, os.IsNotExist(err), must.Sprintf("%s exists after a refused install", d))
	}

	// The release's checksum: write the user-data's files as cloud-init does, run the install
	// script it names.
	start = time.Now()
	tf.Must(ctx, append([]string{"apply", "-auto-approve", "-no-color"}, n.vars(url, sum)...)...)
	t.Logf("tofu apply in %s", time.Since(start).Round(time.Millisecond))
	var userData string
	must.NoError(t, tf.Output(ctx, "user_data", &userData))
	files := writeFiles(t, userData)
	secrets := []string{n.consulAgentToken, n.nomadConsulTk}
	for _, f := range files {
		data, err := os.ReadFile(f)
		must.NoError(t, err)
		fi, err := os.Stat(f)
		must.NoError(t, err)
		for _, s := range secrets {
			if strings.Contains(string(data), s) {
				must.Eq(t, os.FileMode(0o600), fi.Mode().Perm(), must.Sprintf("%s holds a token", f))
			}
		}
	}
	install := filepath.Join(dir, "sbin", "oasis-install.sh")
	must.SliceContains(t, files, install)
	out, err = exec.CommandContext(ctx, "/bin/bash", install).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	for _, f := range []string{"prefix/bin/oasis-sim", "nomad/plugins/nomad-driver-llm", "nomad/plugins/nomad-device-gpu"} {
		fi, err := os.Stat(filepath.Join(dir, f))
		must.NoError(t, err)
		must.Eq(t, os.FileMode(0o755), fi.Mode().Perm(), must.Sprintf("mode of %s", f))
	}
	must.True(t, isDir(filepath.Join(dir, "kvcached")), must.Sprint("no kvcached dir"))

	// The Consul client agent from the rendered configuration directory.
	consulBin, nomadBin := filepath.Join(root, "bin", "consul"), filepath.Join(root, "bin", "nomad")
	for _, b := range []string{consulBin, nomadBin} {
		if _, err := os.Stat(b); err != nil {
			testutil.SkipUnlessCI(t, b+" missing: run make hashistack")
		}
	}
	consulAgent, err := testbed.StartExtraAgent(consulBin, []string{"agent", "-config-dir", filepath.Join(dir, "consul.d")},
		dir, filepath.Join(dir, "consul.log"), "")
	must.NoError(t, err)
	var nomadAgent *testbed.ExtraAgent
	nomadDataDir := filepath.Join(dir, "nomad", "data")
	// The llm driver runs engines as nobody: the installed binaries and the allocation
	// directories under the data dir must be reachable (as a node's bootstrap makes them).
	for _, d := range []string{nomadDataDir, filepath.Join(dir, "prefix"), filepath.Join(dir, "prefix", "bin")} {
		must.NoError(t, os.MkdirAll(d, 0o755))
		must.NoError(t, os.Chmod(d, 0o755))
	}
	t.Cleanup(func() {
		// The job first, while its client runs, so Nomad itself ends the task.
		sctx, scancel := context.WithTimeout(context.Background(), time.Minute)
		defer scancel()
		if err := stack.StopJob(sctx, "tiny-sim-agg"); err != nil {
			t.Logf("stopping tiny-sim-agg: %v", err)
		}
		if nomadAgent != nil {
			if err := nomadAgent.Stop(); err != nil {
				t.Errorf("stopping the node's nomad agent: %v", err)
			}
			if left := testbed.AllocCgroups(nomadDataDir); len(left) > 0 {
				t.Errorf("cgroups left behind: %v", left)
			}
			if mounts := mountsUnder(t, dir); len(mounts) > 0 {
				t.Errorf("mounts left behind: %v", mounts)
			}
			if nodes, _, err := stack.Nomad.Nodes().PrefixList(""); err == nil {
				for _, nd := range nodes {
					if nd.Name == nodeName {
						_, _, _ = stack.Nomad.Nodes().Purge(nd.ID, nil)
					}
				}
			}
		}
		if err := consulAgent.Stop(); err != nil {
			t.Errorf("stopping the node's consul agent: %v", err)
		}
	})
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		if consulAgent.Exited() {
			return fmt.Errorf("consul client agent exited:\n%s", consulAgent.Tail())
		}
		// Its node in the catalog: it joined the LAN and its agent token lets it register itself.
		node, _, err := stack.Consul.Catalog().Node(nodeName, nil)
		if err != nil {
			return err
		}
		if node == nil {
			return fmt.Errorf("no catalog node %s yet:\n%s", nodeName, consulAgent.Tail())
		}
		return nil
	}), wait.Timeout(time.Minute), wait.Gap(250*time.Millisecond)))

	// The second Nomad client, from the rendered configuration directory (nomad.hcl + secrets.hcl).
	start = time.Now()
	nomadAgent, err = testbed.StartExtraAgent(nomadBin, []string{"agent", "-config", filepath.Join(dir, "nomad.d")},
		dir, filepath.Join(dir, "nomad.log"), nomadDataDir)
	must.NoError(t, err)
	wctx, wcancel := context.WithTimeout(ctx, 2*time.Minute)
	nd, err := stack.WaitNomadNode(wctx, nomadAgent, nodeName)
	wcancel()
	must.NoError(t, err)
	t.Logf("nomad client %s ready with the llm driver in %s", nd.ID, time.Since(start).Round(time.Millisecond))
	must.NotEq(t, stack.NodeID, nd.ID)
	must.Eq(t, nodePool, nd.NodePool)
	must.Eq(t, "e2e-sim", nd.NodeClass)
	must.Eq(t, stack.Datacenter, nd.Datacenter)
	must.Eq(t, "nomad-gpu-client", nd.Meta["oasis.provisioned_by"])
	must.MapContainsKey(t, nd.Attributes, "driver.llm.sim.version")
	must.MapContainsKey(t, nd.HostVolumes, "oasis-kvcached")
	must.Eq(t, filepath.Join(dir, "kvcached"), nd.HostVolumes["oasis-kvcached"].Path)
	// The agent registers itself in Consul with the token from secrets.hcl (merged with nomad.hcl).
	must.Wait(t, wait.InitialSuccess(wait.ErrorFunc(func() error {
		svcs, _, err := stack.Consul.Catalog().Service("nomad-client", "", nil)
		if err != nil {
			return err
		}
		for _, s := range svcs {
			if s.Node == nodeName {
				return nil
			}
		}
		return fmt.Errorf("no nomad-client service on consul node %s", nodeName)
	}), wait.Timeout(time.Minute), wait.Gap(250*time.Millisecond)))

	// The sim recipe, in the node's pool: the engine runs there and passes in Consul, registered
	// through the node's own Consul agent.
	start = time.Now()
	must.NoError(t, stack.RunJobFile(ctx, filepath.Join(root, "recipes", "tiny", "sim", "agg", "job.nomad.hcl"),
		map[string]string{"count": "1", "speed": "0", "node_pool": nodePool}))
	allocs, _, err := stack.Nomad.Jobs().Allocations("tiny-sim-agg", false, nil)
	must.NoError(t, err)
	must.SliceLen(t, 1, allocs)
	must.Eq(t, nd.ID, allocs[0].NodeID)
	entries, _, err := stack.Consul.Health().Service("oasis-engine", "", true, (&consulapi.QueryOptions{}).WithContext(ctx))
	must.NoError(t, err)
	must.SliceLen(t, 1, entries)
	must.Eq(t, nodeName, entries[0].Node.Node, must.Sprint("the engine is not registered through the node's Consul agent"))
	must.Eq(t, nd.ID, entries[0].Service.Meta["oasis_node"])
	t.Logf("sim recipe passing in Consul on the new node in %s", time.Since(start).Round(time.Millisecond))
	must.True(t, runsFrom(t, filepath.Join(dir, "prefix", "bin", "oasis-sim")),
		must.Sprint("no process runs the installed oasis-sim"))
	resp, err := http.Get(fmt.Sprintf("http://%s:%d/health", entries[0].Service.Address, entries[0].Service.Port))
	must.NoError(t, err)
	resp.Body.Close()
	must.Eq(t, http.StatusOK, resp.StatusCode)
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// runsFrom reports whether a process on the machine was started from the executable path.
func runsFrom(t *testing.T, path string) bool {
	t.Helper()
	cmdlines, err := filepath.Glob("/proc/[0-9]*/cmdline")
	must.NoError(t, err)
	for _, f := range cmdlines {
		b, err := os.ReadFile(f)
		if argv0, _, ok := strings.Cut(string(b), "\x00"); err == nil && ok && argv0 == path {
			return true
		}
	}
	return false
}

// mountsUnder lists the mount points below dir.
func mountsUnder(t *testing.T, dir string) []string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	must.NoError(t, err)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}
