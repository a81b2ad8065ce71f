locals {
  # Whether a secret is given is no secret: it decides which files exist.
  has_nomad_secrets  = nonsensitive(var.nomad_consul_token != "")
  has_consul_secrets = nonsensitive(var.consul_agent_token != "" || var.consul_gossip_key != "")

  bin_dir = "${var.install_prefix}/bin"

  # The llm driver runs oasis-sim from the install prefix; other engines as configured.
  llm_binaries = merge({ sim = "${local.bin_dir}/oasis-sim" }, var.llm_engine_binaries)

  consul_scheme      = var.consul_ports.https > 0 ? "https" : "http"
  consul_http_port   = var.consul_ports.https > 0 ? var.consul_ports.https : var.consul_ports.http
  consul_nomad_addr  = var.consul_nomad_address != "" ? var.consul_nomad_address : "${var.consul_client_addr}:${local.consul_http_port}"
  consul_grpc_port   = var.consul_ports.grpc_tls > 0 ? var.consul_ports.grpc_tls : var.consul_ports.grpc
  consul_nomad_grpc  = local.consul_grpc_port > 0 ? "${var.consul_client_addr}:${local.consul_grpc_port}" : ""
  nomad_config_file  = "${var.nomad_config_dir}/nomad.hcl"
  nomad_secrets_file = "${var.nomad_config_dir}/secrets.hcl"
  consul_config_file = "${var.consul_config_dir}/consul.hcl"
  consul_secret_file = "${var.consul_config_dir}/secrets.hcl"
  bootstrap_path     = "${dirname(var.install_script_path)}/oasis-node-bootstrap.sh"

  nomad_client_config = templatefile("${path.module}/templates/nomad.hcl.tftpl", {
    name               = var.node_name
    region             = var.region
    datacenter         = var.datacenter
    data_dir           = var.nomad_data_dir
    plugin_dir         = var.nomad_plugin_dir
    bind_addr          = var.nomad_bind_addr
    advertise          = var.nomad_advertise_addr
    log_level          = var.nomad_log_level
    ports              = var.nomad_ports
    node_pool          = var.node_pool
    node_class         = var.node_class
    network_interface  = var.nomad_network_interface
    dynamic_ports      = var.nomad_dynamic_ports
    servers            = var.nomad_servers
    meta               = var.meta
    options            = var.nomad_client_options
    host_volume        = var.kvcached_host_volume
    kvcached_dir       = var.kvcached_dir
    consul_address     = local.consul_nomad_addr
    consul_grpc        = local.consul_nomad_grpc
    consul_ssl         = local.consul_scheme == "https"
    consul_tls         = var.consul_tls
    acl_enabled        = var.nomad_acl_enabled
    tls                = var.nomad_tls
    llm_binaries       = local.llm_binaries
    llm_fingerprint    = var.llm_fingerprint_period
    gpu_device_plugin  = var.gpu_device_plugin
    gpu_ignored_ids    = var.gpu_ignored_ids
    gpu_fingerprint    = var.gpu_fingerprint_period
    nomad_secrets_file = local.nomad_secrets_file
  })

  # Only the secrets: written with mode 0600 beside nomad.hcl, merged by `nomad agent -config <dir>`.
  nomad_secrets_config = !local.has_nomad_secrets ? "" : templatefile("${path.module}/templates/nomad-secrets.hcl.tftpl", {
    consul_token = var.nomad_consul_token
  })

  consul_client_config = templatefile("${path.module}/templates/consul.hcl.tftpl", {
    name        = var.node_name
    datacenter  = var.datacenter
    data_dir    = var.consul_data_dir
    bind_addr   = var.consul_bind_addr
    client_addr = var.consul_client_addr
    retry_join  = var.consul_retry_join
    ports       = var.consul_ports
    log_level   = var.consul_log_level
    acl_enabled = var.consul_acl_enabled
    tls         = var.consul_tls
    secrets     = local.consul_secret_file
  })

  consul_secrets_config = !local.has_consul_secrets ? "" : templatefile("${path.module}/templates/consul-secrets.hcl.tftpl", {
    agent_token = var.consul_agent_token
    gossip_key  = var.consul_gossip_key
  })

  install_script = templatefile("${path.module}/templates/install.sh.tftpl", {
    url               = var.oasis_release_url
    sha256            = lower(var.oasis_release_sha256)
    bin_dir           = local.bin_dir
    plugin_dir        = var.nomad_plugin_dir
    gpu_device_plugin = var.gpu_device_plugin
    kvcached_dir      = var.kvcached_dir
    kvcached_device   = var.kvcached_device
    kvcached_fs       = var.kvcached_filesystem
    fstab             = var.fstab_path
  })

  bootstrap_script = templatefile("${path.module}/templates/bootstrap.sh.tftpl", {
    nomad_version     = var.nomad_version
    consul_version    = var.consul_version
    consul_config_dir = var.consul_config_dir
    consul_data_dir   = var.consul_data_dir
    install_script    = var.install_script_path
  })

  # Files cloud-init writes before runcmd. Whatever holds a token or a key is mode 0600 and
  # root's (bootstrap hands Consul's to the consul user once the package has created it).
  config_files = concat(
    [
      { path = local.nomad_config_file, permissions = "0644", content = local.nomad_client_config },
      { path = local.consul_config_file, permissions = "0644", content = local.consul_client_config },
      { path = var.install_script_path, permissions = "0755", content = local.install_script },
      { path = local.bootstrap_path, permissions = "0755", content = local.bootstrap_script },
    ],
    !local.has_nomad_secrets ? [] : [
      { path = local.nomad_secrets_file, permissions = "0600", content = local.nomad_secrets_config },
    ],
    !local.has_consul_secrets ? [] : [
      { path = local.consul_secret_file, permissions = "0600", content = local.consul_secrets_config },
    ],
  )

  cloud_config = {
    write_files = [for f in local.config_files : {
      path        = f.path
      owner       = "root:root"
      permissions = f.permissions
      content     = f.content
    }]
    runcmd = [
      ["/bin/bash", local.bootstrap_path],
    ]
  }

  user_data = "#cloud-config\n${yamlencode(local.cloud_config)}"
}
