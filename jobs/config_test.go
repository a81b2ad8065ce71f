package jobs

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/agentconfig"
	kvcached "github.com/oasis-llm/oasis/kvcached/app"
	router "github.com/oasis-llm/oasis/router/app"
)

// nomadBinary is $OASIS_NOMAD_BIN, bin/nomad (make hashistack) or nomad on $PATH.
func nomadBinary(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("OASIS_NOMAD_BIN"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../bin/nomad"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("nomad")
	if err != nil {
		t.Skip("no nomad binary (make hashistack, or set OASIS_NOMAD_BIN)")
	}
	return p
}

// envRef is a runtime value of a Nomad template: {{ env "NAME" }}.
var envRef = regexp.MustCompile(`\{\{ env "([^"]+)" \}\}`)

// renderConfig parses a job as `nomad job run -output` does (locally, no agent), with vars, and
// returns its task's args and the config file its template renders, runtime values filled in.
func renderConfig(t *testing.T, nomad, file, dest string, vars ...string) ([]string, string) {
	t.Helper()
	args := []string{"job", "run", "-output"}
	for _, v := range vars {
		args = append(args, "-var", v)
	}
	out, err := exec.Command(nomad, append(args, file)...).Output()
	must.NoError(t, err, must.Sprintf("nomad job run -output %s %v", file, vars))
	var job struct {
		Job struct {
			TaskGroups []struct {
				Tasks []struct {
					Config    struct{ Args []string }
					Templates []struct{ DestPath, EmbeddedTmpl string }
				}
			}
		}
	}
	must.NoError(t, json.Unmarshal(out, &job))
	task := job.Job.TaskGroups[0].Tasks[0]
	for _, tmpl := range task.Templates {
		if tmpl.DestPath == dest {
			return task.Config.Args, envRef.ReplaceAllStringFunc(tmpl.EmbeddedTmpl, func(s string) string {
				switch name := envRef.FindStringSubmatch(s)[1]; name {
				case "NOMAD_SECRETS_DIR":
					return "/alloc/task/secrets"
				case "attr.unique.network.ip-address", "NOMAD_IP_peers":
					return "10.0.0.7"
				case "node.unique.id":
					return "node-7"
				default:
					must.True(t, strings.HasPrefix(name, "NOMAD_PORT_"), must.Sprintf("unexpected env %s", name))
					return "20000"
				}
			})
		}
	}
	t.Fatalf("%s renders no %s", file, dest)
	return nil, ""
}

// The jobs pass only -config; the file they render from their variables, in every combination
// of the switches, is one the daemon accepts and holds what the variables say.
func TestJobsRenderConfigFiles(t *testing.T) {
	nomad := nomadBinary(t)
	cases := []struct {
		file, dest string
		keys       []agentconfig.Key
		vars       []string
		want       map[string]string // key path → flag value
		absent     []string          // key paths
	}{
		{file: "router.nomad.hcl", dest: "local/router.hcl", keys: router.ConfigKeys,
			want: map[string]string{"listeners.api": "127.0.0.1:8080", "telemetry.tracing.sample_ratio": "0.05", "telemetry.tracing.otlp_endpoint": "",
				"log_json": "true", "telemetry.metrics.power_from_nomad": "true", "discovery.consul_addr": "127.0.0.1:8500",
				"policy.kv_prefix": "oasis/router", "policy.api_keys_kv": "false", "limits.max_connections": "4096",
				"limits.max_connections_per_source": "1024", "discovery.hosted_upstreams": "", "peers.node": "node-7"},
			absent: []string{"tls.cert", "mesh.service", "federation.listen", "policy.response_id_key_file", "peers.listen"}},
		{file: "router.nomad.hcl", dest: "local/router.hcl", keys: router.ConfigKeys,
			vars: []string{"tls_enabled=true", "tls_mutual=true", "federation_enabled=true", "federation_dc=dc2", "otlp_endpoint=http://10.0.0.9:4318",
				"trace_sample_ratio=1", `hosted_upstreams=["https://a.example.com/v1","https://*.b.example.com"]`, `hosted_key_envs=["K=https://a.example.com/v1"]`,
				"kv_prefix=x/y", "api_keys_kv=true", "max_connections=10", "bind_address=0.0.0.0", "response_id_key=true"},
			want: map[string]string{"listeners.api": "0.0.0.0:8080", "tls.cert": "/alloc/task/secrets/tls/cert.pem", "tls.key": "/alloc/task/secrets/tls/key.pem",
				"tls.client_ca": "/alloc/task/secrets/tls/client-ca.pem", "federation.listen": "0.0.0.0:8443", "federation.datacenter": "dc2",
				"federation.tls_ca": "/alloc/task/secrets/tls/federation-ca.pem", "telemetry.tracing.otlp_endpoint": "http://10.0.0.9:4318",
				"telemetry.tracing.sample_ratio": "1", "discovery.hosted_upstreams": "https://a.example.com/v1,https://*.b.example.com",
				"discovery.hosted_key_envs": "K=https://a.example.com/v1", "policy.kv_prefix": "x/y", "policy.api_keys_kv": "true", "limits.max_connections": "10",
				"policy.response_id_key_file": "/alloc/task/secrets/response-id-key"}},
		{file: "router.nomad.hcl", dest: "local/router.hcl", keys: router.ConfigKeys,
			vars: []string{"peers_enabled=true"},
			want: map[string]string{"peers.listen": "10.0.0.7:20000", "peers.key_file": "/alloc/task/secrets/peers-key",
				"peers.interval": "200ms", "peers.min_interval": "10ms"}},
		{file: "router.nomad.hcl", dest: "local/router.hcl", keys: router.ConfigKeys,
			vars: []string{"peers_enabled=true", "peers_interval=1s", "peers_min_interval=50ms"},
			want: map[string]string{"peers.interval": "1s", "peers.min_interval": "50ms"}},
		{file: "router.nomad.hcl", dest: "local/router.hcl", keys: router.ConfigKeys,
			vars: []string{"mesh_enabled=true", "mesh_plain_listener=false", "federation_enabled=true"},
			want: map[string]string{"listeners.api": "off", "mesh.service": "oasis-router", "mesh.listen": "127.0.0.1:20000", "mesh.engines": "true",
				"federation.listen": "127.0.0.1:8443"},
			absent: []string{"federation.tls_cert", "tls.cert"}},
		{file: "kvcached.nomad.hcl", dest: "local/kvcached.hcl", keys: kvcached.ConfigKeys,
			want: map[string]string{"listeners.resp": "127.0.0.1:6380", "listeners.http": "127.0.0.1:9380", "tiers.ram.bytes": "4294967296",
				"tiers.disk.bytes": "68719476736", "tiers.disk.dir": "/var/lib/oasis-kvcached",
				"telemetry.kv_events.endpoint": "tcp://10.0.0.7:20000", "telemetry.kv_events.replay_endpoint": "tcp://10.0.0.7:20000",
				// A password by default (auth_enabled = true).
				"auth.password_file": "secrets/redis-password"},
			absent: []string{"listeners.quic", "tls.ca", "peers.consul_addr", "peers.mesh"}},
		{file: "kvcached.nomad.hcl", dest: "local/kvcached.hcl", keys: kvcached.ConfigKeys,
			vars:   []string{"auth_enabled=false"},
			absent: []string{"auth.password_file"}},
		{file: "kvcached.nomad.hcl", dest: "local/kvcached.hcl", keys: kvcached.ConfigKeys,
			vars: []string{"peers_enabled=true", "auth_enabled=true", "peer_verify_address=true", "disk_bytes=0", `peer_datacenters=["dc2","dc3"]`, "kv_events_address=10.1.1.1"},
			want: map[string]string{"listeners.quic": "0.0.0.0:9381", "tls.ca": "secrets/ca.pem", "tls.cert": "secrets/cert.pem", "tls.key": "secrets/key.pem",
				"tls.verify_address": "true", "peers.consul_addr": "127.0.0.1:8500", "auth.password_file": "secrets/redis-password", "tiers.disk.bytes": "0",
				"peers.datacenters": "dc2,dc3", "peers.wan_bytes_per_second": "104857600", "peers.wan_timeout": "5s",
				"telemetry.kv_events.endpoint": "tcp://10.1.1.1:20000"},
			absent: []string{"peers.mesh"}},
		{file: "kvcached.nomad.hcl", dest: "local/kvcached.hcl", keys: kvcached.ConfigKeys,
			vars:   []string{"peers_enabled=true", "mesh=true", "bind_address=10.0.0.7"},
			want:   map[string]string{"listeners.quic": "10.0.0.7:9381", "listeners.resp": "10.0.0.7:6380", "peers.mesh": "true"},
			absent: []string{"tls.ca", "tls.verify_address", "peers.consul_addr", "peers.datacenters"}},
	}
	for _, tc := range cases {
		t.Run(tc.file+" "+strings.Join(tc.vars, " "), func(t *testing.T) {
			args, src := renderConfig(t, nomad, tc.file, tc.dest, tc.vars...)
			must.Eq(t, 2, len(args))
			must.Eq(t, "config", strings.TrimLeft(args[0], "-"))
			must.Eq(t, "${NOMAD_TASK_DIR}/"+filepath.Base(tc.dest), args[1])
			settings, err := agentconfig.Parse(tc.keys, filepath.Base(tc.dest), []byte(src))
			must.NoError(t, err, must.Sprint(src))
			got := map[string]string{}
			for _, s := range settings {
				got[s.Key.Path()] = s.Value
			}
			for k, v := range tc.want {
				must.MapContainsKey(t, got, k, must.Sprint(src))
				must.Eq(t, v, got[k], must.Sprintf("%s in\n%s", k, src))
			}
			for _, k := range tc.absent {
				must.MapNotContainsKey(t, got, k, must.Sprint(src))
			}
		})
	}
}
