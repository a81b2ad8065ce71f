output "user_data" {
  description = "cloud-init user-data (#cloud-config): the files below, then the bootstrap script (HashiCorp apt repository, pinned nomad and consul, the install script, the systemd units). Sensitive: it holds the secrets given as inputs."
  value       = local.user_data
  sensitive   = true
}

output "user_data_base64" {
  description = "user_data, base64-encoded (launch templates take it so)."
  value       = base64encode(local.user_data)
  sensitive   = true
}

output "nomad_client_config" {
  description = "The Nomad client agent configuration (HCL), without secrets; written to <nomad_config_dir>/nomad.hcl, mode 0644."
  value       = local.nomad_client_config
}

output "nomad_secrets_config" {
  description = "The Nomad agent's secrets (consul.token), written to <nomad_config_dir>/secrets.hcl, mode 0600; empty when nomad_consul_token is empty."
  value       = local.nomad_secrets_config
  sensitive   = true
}

output "consul_client_config" {
  description = "The Consul client agent configuration (HCL), without secrets; written to <consul_config_dir>/consul.hcl, mode 0644."
  value       = local.consul_client_config
}

output "consul_secrets_config" {
  description = "The Consul agent's secrets (encrypt, acl.tokens.agent), written to <consul_config_dir>/secrets.hcl, mode 0600; empty when both are empty."
  value       = local.consul_secrets_config
  sensitive   = true
}

output "install_script" {
  description = "Bash script installing the Oasis release: download, sha256 check (refuses a mismatch), commands into <install_prefix>/bin, plugins into plugin_dir, kvcached disk."
  value       = local.install_script
}

output "bootstrap_script" {
  description = "Bash script cloud-init runs: HashiCorp apt repository, nomad and consul at the pinned versions, the install script, then consul and nomad enabled and started."
  value       = local.bootstrap_script
}

output "files" {
  description = "Every file user_data writes: path => permissions (the contents are in the other outputs)."
  value       = { for f in local.config_files : f.path => f.permissions }
}

output "paths" {
  description = "Where things land on the node."
  value = {
    bin_dir            = local.bin_dir
    plugin_dir         = var.nomad_plugin_dir
    nomad_data_dir     = var.nomad_data_dir
    nomad_config_file  = local.nomad_config_file
    nomad_secrets_file = local.nomad_secrets_file
    consul_config_file = local.consul_config_file
    consul_secret_file = local.consul_secret_file
    install_script     = var.install_script_path
    bootstrap_script   = local.bootstrap_path
    kvcached_dir       = var.kvcached_dir
  }
}
