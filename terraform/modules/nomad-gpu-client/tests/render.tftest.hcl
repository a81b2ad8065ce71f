# tofu test: what the module renders for a GPU node, and the inputs it refuses.

variables {
  oasis_release_url    = "https://releases.example.com/oasis_1.2.3_linux_amd64.tar.gz"
  oasis_release_sha256 = "0123456789abcdef0123456789ABCDEF0123456789abcdef0123456789abcdef"
  nomad_servers        = ["10.0.0.10:4647", "provider=aws tag_key=nomad-role tag_value=server"]
  consul_retry_join    = ["10.0.0.20", "provider=gce tag_value=consul-server"]
  node_name            = "gpu-7"
  datacenter           = "us-east-1"
  region               = "us"
  node_pool            = "gpu-a100"
  node_class           = "a100-80g"
  meta                 = { "oasis.gpu_model" = "A100-80GB", "zone" = "us-east-1a" }
  nomad_data_dir       = "/srv/nomad"
  nomad_plugin_dir     = "/srv/nomad/plugins"
  install_prefix       = "/opt/oasis"
  kvcached_dir         = "/mnt/kvcached"
  kvcached_device      = "/dev/nvme1n1"
  llm_engine_binaries  = { vllm = "/opt/vllm/bin/vllm" }
  nomad_consul_token   = "6f1b0c4e-1111-4222-8333-944445555666"
  consul_agent_token   = "0a2b4c6d-aaaa-4bbb-8ccc-dddddddddddd"
  consul_gossip_key    = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
}

run "renders_a_gpu_node" {
  command = apply

  # Nomad client: identity, paths, join, both Oasis plugins with their real config keys.
  assert {
    condition = alltrue([for s in [
      "name       = \"gpu-7\"",
      "region     = \"us\"",
      "datacenter = \"us-east-1\"",
      "data_dir   = \"/srv/nomad\"",
      "plugin_dir = \"/srv/nomad/plugins\"",
      "node_pool = \"gpu-a100\"",
      "node_class = \"a100-80g\"",
      "\"oasis.gpu_model\" = \"A100-80GB\"",
      "retry_join     = [\"10.0.0.10:4647\",\"provider=aws tag_key=nomad-role tag_value=server\"]",
      "plugin \"nomad-driver-llm\" {",
      "sim = \"/opt/oasis/bin/oasis-sim\"",
      "vllm = \"/opt/vllm/bin/vllm\"",
      "fingerprint_period = \"30s\"",
      "plugin \"nomad-device-gpu\" {",
      "ignored_gpu_ids    = []",
      "host_volume \"oasis-kvcached\" {",
      "path      = \"/mnt/kvcached\"",
      "address          = \"127.0.0.1:8500\"",
      "enabled = true",
      "server {\n  enabled = false\n}",
    ] : strcontains(output.nomad_client_config, s)])
    error_message = "nomad_client_config misses an expected line:\n${output.nomad_client_config}"
  }

  assert {
    condition = alltrue([for s in [
      "node_name   = \"gpu-7\"",
      "datacenter  = \"us-east-1\"",
      "server      = false",
      "retry_join  = [\"10.0.0.20\",\"provider=gce tag_value=consul-server\"]",
      "http     = 8500",
      "default_policy           = \"deny\"",
    ] : strcontains(output.consul_client_config, s)])
    error_message = "consul_client_config misses an expected line:\n${output.consul_client_config}"
  }

  # The install script: the URL, the checksum (lowercased), the paths, both plugins, the device.
  assert {
    condition = alltrue([for s in [
      "url='https://releases.example.com/oasis_1.2.3_linux_amd64.tar.gz'",
      "sha256='0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef'",
      "bin_dir='/opt/oasis/bin'",
      "plugin_dir='/srv/nomad/plugins'",
      "plugins=(nomad-driver-llm nomad-device-gpu)",
      "kvcached_device='/dev/nvme1n1'",
      "checksum mismatch",
    ] : strcontains(output.install_script, s)])
    error_message = "install_script misses an expected line"
  }

  assert {
    condition     = strcontains(output.bootstrap_script, "nomad=1.11.0-1 consul=1.22.0-1") && strcontains(output.bootstrap_script, "/bin/bash '/usr/local/sbin/oasis-install.sh'") && strcontains(output.bootstrap_script, "systemctl enable --now nomad.service")
    error_message = "bootstrap_script does not install the pinned agents, run the install script and start nomad"
  }

  # Secrets: only in the 0600 secrets files, never in the 0644 configs or the scripts.
  assert {
    condition = alltrue([for secret in [var.nomad_consul_token, var.consul_agent_token, var.consul_gossip_key] :
      !strcontains(output.nomad_client_config, secret) && !strcontains(output.consul_client_config, secret) &&
    !strcontains(output.install_script, secret) && !strcontains(output.bootstrap_script, secret)])
    error_message = "a secret leaked into a non-secret output"
  }

  assert {
    condition     = strcontains(output.nomad_secrets_config, "token = \"${var.nomad_consul_token}\"") && strcontains(output.consul_secrets_config, "agent = \"${var.consul_agent_token}\"") && strcontains(output.consul_secrets_config, "encrypt = \"${var.consul_gossip_key}\"")
    error_message = "the secrets files do not hold the secrets"
  }

  # user_data is #cloud-config: every file holding a secret is 0600, every 0600 file is a
  # secrets file, and runcmd runs the bootstrap script.
  assert {
    condition     = startswith(output.user_data, "#cloud-config\n")
    error_message = "user_data does not start with #cloud-config"
  }

  assert {
    condition = alltrue([for f in yamldecode(output.user_data).write_files :
      f.permissions == "0600" if anytrue([for s in [var.nomad_consul_token, var.consul_agent_token, var.consul_gossip_key] : strcontains(f.content, s)])
    ])
    error_message = "a file holding a secret is not mode 0600"
  }

  assert {
    condition = sort([for f in yamldecode(output.user_data).write_files : f.path if f.permissions == "0600"]) == tolist([
      "/etc/consul.d/secrets.hcl", "/etc/nomad.d/secrets.hcl",
    ])
    error_message = "the 0600 files are not exactly the two secrets files"
  }

  assert {
    condition     = length([for f in yamldecode(output.user_data).write_files : f if anytrue([for s in [var.nomad_consul_token, var.consul_agent_token, var.consul_gossip_key] : strcontains(f.content, s)])]) == 2
    error_message = "the secrets are not in exactly two files"
  }

  assert {
    condition     = yamldecode(output.user_data).runcmd == [["/bin/bash", "/usr/local/sbin/oasis-node-bootstrap.sh"]]
    error_message = "runcmd does not run the bootstrap script"
  }

  assert {
    condition     = length(output.user_data) <= 16384
    error_message = "user_data is over EC2's 16 KiB user-data limit"
  }

  assert {
    condition     = base64decode(output.user_data_base64) == output.user_data
    error_message = "user_data_base64 is not user_data"
  }

  assert {
    condition     = output.files["/etc/nomad.d/nomad.hcl"] == "0644" && output.files["/usr/local/sbin/oasis-install.sh"] == "0755"
    error_message = "files does not list the configs with their modes"
  }
}

run "no_secrets_no_secret_files" {
  command = plan

  variables {
    nomad_consul_token = ""
    consul_agent_token = ""
    consul_gossip_key  = ""
  }

  assert {
    condition     = output.nomad_secrets_config == "" && output.consul_secrets_config == ""
    error_message = "secrets files rendered without secrets"
  }

  assert {
    condition     = length([for f in yamldecode(output.user_data).write_files : f if f.permissions == "0600"]) == 0 && length(yamldecode(output.user_data).write_files) == 4
    error_message = "user_data writes secrets files without secrets"
  }
}

run "loopback_test_node_without_gpu_plugin" {
  command = plan

  variables {
    oasis_release_url       = "http://127.0.0.1:8080/oasis.tar.gz"
    allow_insecure_download = true
    gpu_device_plugin       = false
    nomad_ports             = { http = 24646, rpc = 24647, serf = 24648 }
    nomad_bind_addr         = "127.0.0.1"
    nomad_advertise_addr    = "127.0.0.1"
    nomad_network_interface = "lo"
    nomad_dynamic_ports     = { min = 40000, max = 41000 }
    nomad_client_options    = { "fingerprint.denylist" = "env_aws,env_gce" }
    consul_ports            = { http = 28500, dns = -1, grpc = -1, serf_lan = 28301 }
    consul_bind_addr        = "127.0.0.1"
  }

  assert {
    condition = alltrue([for s in [
      "http = 24646",
      "rpc  = \"127.0.0.1:24647\"",
      "network_interface = \"lo\"",
      "min_dynamic_port = 40000",
      "\"fingerprint.denylist\" = \"env_aws,env_gce\"",
      "address          = \"127.0.0.1:28500\"",
    ] : strcontains(output.nomad_client_config, s)])
    error_message = "nomad_client_config ignores the ports:\n${output.nomad_client_config}"
  }

  assert {
    condition     = !strcontains(output.nomad_client_config, "nomad-device-gpu") && !strcontains(output.nomad_client_config, "grpc_address") && strcontains(output.install_script, "plugins=(nomad-driver-llm)")
    error_message = "gpu_device_plugin = false still loads or requires the device plugin"
  }

  assert {
    condition     = strcontains(output.consul_client_config, "dns      = -1") && strcontains(output.consul_client_config, "serf_lan = 28301")
    error_message = "consul_client_config ignores the ports"
  }
}

run "tls" {
  command = plan

  variables {
    nomad_tls    = { ca_file = "/etc/nomad.d/tls/ca.pem", cert_file = "/etc/nomad.d/tls/client.pem", key_file = "/etc/nomad.d/tls/client-key.pem" }
    consul_tls   = { ca_file = "/etc/consul.d/tls/ca.pem" }
    consul_ports = { https = 8501, http = -1 }
  }

  assert {
    condition     = strcontains(output.nomad_client_config, "tls {\n  http                   = true") && strcontains(output.nomad_client_config, "key_file               = \"/etc/nomad.d/tls/client-key.pem\"") && strcontains(output.nomad_client_config, "address          = \"127.0.0.1:8501\"") && strcontains(output.nomad_client_config, "ssl              = true") && strcontains(output.nomad_client_config, "ca_file          = \"/etc/consul.d/tls/ca.pem\"")
    error_message = "TLS settings missing:\n${output.nomad_client_config}"
  }

  assert {
    condition     = strcontains(output.consul_client_config, "ca_file         = \"/etc/consul.d/tls/ca.pem\"") && !strcontains(output.consul_client_config, "cert_file")
    error_message = "Consul TLS settings wrong:\n${output.consul_client_config}"
  }
}

# Refused inputs: each names its variable.

run "checksum_not_hex" {
  command = plan
  variables {
    oasis_release_sha256 = "sha256:0123"
  }
  expect_failures = [var.oasis_release_sha256]
}

run "http_url_needs_allow_insecure" {
  command = plan
  variables {
    oasis_release_url = "http://releases.example.com/oasis.tar.gz"
  }
  expect_failures = [var.oasis_release_url]
}

run "url_with_quote" {
  command = plan
  variables {
    oasis_release_url = "https://example.com/a'b.tar.gz"
  }
  expect_failures = [var.oasis_release_url]
}

run "node_pool_all_is_reserved" {
  command = plan
  variables {
    node_pool = "all"
  }
  expect_failures = [var.node_pool]
}

run "node_pool_syntax" {
  command = plan
  variables {
    node_pool = "gpu pool"
  }
  expect_failures = [var.node_pool]
}

run "relative_plugin_dir" {
  command = plan
  variables {
    nomad_plugin_dir = "plugins"
  }
  expect_failures = [var.nomad_plugin_dir]
}

run "prefix_with_shell_characters" {
  command = plan
  variables {
    install_prefix = "/opt/$(reboot)"
  }
  expect_failures = [var.install_prefix]
}

run "bad_gossip_key" {
  command = plan
  variables {
    consul_gossip_key = "not-a-key"
  }
  expect_failures = [var.consul_gossip_key]
}

run "bad_agent_token" {
  command = plan
  variables {
    consul_agent_token = "root"
  }
  expect_failures = [var.consul_agent_token]
}

run "unknown_engine" {
  command = plan
  variables {
    llm_engine_binaries = { openai_compat = "/bin/true" }
  }
  expect_failures = [var.llm_engine_binaries]
}

run "no_consul_join" {
  command = plan
  variables {
    consul_retry_join = []
  }
  expect_failures = [var.consul_retry_join]
}

run "bad_versions" {
  command = plan
  variables {
    nomad_version = "latest"
  }
  expect_failures = [var.nomad_version]
}

run "bad_port" {
  command = plan
  variables {
    nomad_ports = { http = 70000 }
  }
  expect_failures = [var.nomad_ports]
}

run "kvcached_device_not_dev" {
  command = plan
  variables {
    kvcached_device = "nvme1n1"
  }
  expect_failures = [var.kvcached_device]
}
