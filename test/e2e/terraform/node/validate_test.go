package node

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/shoenig/test/must"

	"github.com/oasis-llm/oasis/internal/testutil"
	"github.com/oasis-llm/oasis/internal/tofutest"
	"github.com/oasis-llm/oasis/test/e2e/testbed"
)

// TestProductionConfigsValidate renders the module with its production defaults plus everything
// optional turned on (secrets, gossip key, TLS for both agents, Consul over https, meta, engine
// binaries) and has the real agents' validators accept both configuration directories, the way
// the packages' units load them (a directory: the main file and secrets.hcl merged).
func TestProductionConfigsValidate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	root, err := testbed.RepoRoot()
	must.NoError(t, err)
	nomadBin, consulBin := filepath.Join(root, "bin", "nomad"), filepath.Join(root, "bin", "consul")
	for _, b := range []string{nomadBin, consulBin} {
		if _, err := os.Stat(b); err != nil {
			testutil.SkipUnlessCI(t, b+" missing: run make hashistack")
		}
	}
	tf := tofutest.New(t, tofutest.Options{Module: filepath.Join(root, "terraform", "modules", "nomad-gpu-client")})
	tf.Init(ctx)
	tf.Must(ctx, "apply", "-auto-approve", "-no-color",
		"-var", "oasis_release_url=https://releases.example.com/oasis_1.0.0_linux_amd64.tar.gz",
		"-var", "oasis_release_sha256=0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		"-var", `nomad_servers=["provider=aws tag_key=nomad-role tag_value=server"]`,
		"-var", `consul_retry_join=["provider=aws tag_key=consul-role tag_value=server"]`,
		"-var", `meta={ "oasis.gpu_model" = "H100" }`,
		"-var", `llm_engine_binaries={ vllm = "/opt/vllm/bin/vllm", sglang = "/opt/sglang/bin/python3" }`,
		"-var", "kvcached_device=/dev/nvme1n1",
		"-var", `nomad_tls={ ca_file = "/etc/nomad.d/tls/ca.pem", cert_file = "/etc/nomad.d/tls/client.pem", key_file = "/etc/nomad.d/tls/client-key.pem" }`,
		"-var", `consul_tls={ ca_file = "/etc/consul.d/tls/ca.pem", cert_file = "/etc/consul.d/tls/client.pem", key_file = "/etc/consul.d/tls/client-key.pem" }`,
		"-var", "consul_ports={ https = 8501, http = -1, grpc = -1, grpc_tls = 8503 }",
		"-var", "nomad_consul_token=6f1b0c4e-1111-4222-8333-944445555666",
		"-var", "consul_agent_token=0a2b4c6d-aaaa-4bbb-8ccc-dddddddddddd",
		"-var", "consul_gossip_key=AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=")
	dir := t.TempDir()
	write := func(output, path string) {
		var v string
		must.NoError(t, tf.Output(ctx, output, &v))
		must.NotEq(t, "", v, must.Sprintf("%s is empty", output))
		must.NoError(t, os.MkdirAll(filepath.Dir(path), 0o755))
		must.NoError(t, os.WriteFile(path, []byte(v), 0o600))
	}
	write("nomad_client_config", filepath.Join(dir, "nomad.d", "nomad.hcl"))
	write("nomad_secrets_config", filepath.Join(dir, "nomad.d", "secrets.hcl"))
	write("consul_client_config", filepath.Join(dir, "consul.d", "consul.hcl"))
	write("consul_secrets_config", filepath.Join(dir, "consul.d", "secrets.hcl"))

	out, err := exec.CommandContext(ctx, nomadBin, "config", "validate", filepath.Join(dir, "nomad.d")).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "Configuration is valid")
	// consul validate warns (and still accepts) when the TLS files are missing, as they are here.
	out, err = exec.CommandContext(ctx, consulBin, "validate", filepath.Join(dir, "consul.d")).CombinedOutput()
	must.NoError(t, err, must.Sprint(string(out)))
	must.StrContains(t, string(out), "Configuration is valid")

	// The validators do refuse a broken file: the check above means something.
	must.NoError(t, os.WriteFile(filepath.Join(dir, "consul.d", "broken.hcl"), []byte("not_a_consul_key = 1\n"), 0o600))
	out, err = exec.CommandContext(ctx, consulBin, "validate", filepath.Join(dir, "consul.d")).CombinedOutput()
	must.Error(t, err, must.Sprint(string(out)))
	must.NoError(t, os.WriteFile(filepath.Join(dir, "nomad.d", "broken.hcl"), []byte("client { enabled = \"maybe\" }\n"), 0o600))
	out, err = exec.CommandContext(ctx, nomadBin, "config", "validate", filepath.Join(dir, "nomad.d")).CombinedOutput()
	must.Error(t, err, must.Sprint(string(out)))
}
