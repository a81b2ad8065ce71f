# ---------------------------------------------------------------------------------------------
# Oasis release
# ---------------------------------------------------------------------------------------------

variable "oasis_release_url" {
  description = "URL of the Oasis release tarball for the node's architecture (make dist: oasis_<version>_linux_<arch>.tar.gz)."
  type        = string

  validation {
    condition     = can(regex("^https?://[^\\s'\"]+$", var.oasis_release_url))
    error_message = "The oasis_release_url must be an http(s) URL without spaces or quotes."
  }

  validation {
    condition     = startswith(var.oasis_release_url, "https://") || var.allow_insecure_download
    error_message = "The oasis_release_url must be https:// unless allow_insecure_download is true."
  }
}

variable "oasis_release_sha256" {
  description = "SHA-256 of the tarball at oasis_release_url, 64 hex digits (its line in the release's SHA256SUMS). The install script refuses a download that does not match."
  type        = string

  validation {
    condition     = can(regex("^[0-9a-fA-F]{64}$", var.oasis_release_sha256))
    error_message = "The oasis_release_sha256 must be exactly 64 hex digits (the tarball's line in SHA256SUMS, without the file name)."
  }
}

variable "allow_insecure_download" {
  description = "Allow an http:// oasis_release_url. Off by default: the checksum still protects the binaries, but nothing else about the download is authenticated. Tests serving a tarball on loopback turn it on."
  type        = bool
  default     = false
}

variable "install_prefix" {
  description = "Prefix the Oasis commands (oasis-router, oasis-kvcached, oasis-sim) are installed under: <install_prefix>/bin."
  type        = string
  default     = "/usr/local"

  validation {
    condition     = startswith(var.install_prefix, "/") && !can(regex("[\\s'\"$`\\\\]", var.install_prefix))
    error_message = "The install_prefix must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "install_script_path" {
  description = "Where cloud-init writes the install script on the node."
  type        = string
  default     = "/usr/local/sbin/oasis-install.sh"

  validation {
    condition     = startswith(var.install_script_path, "/") && !can(regex("[\\s'\"$`\\\\]", var.install_script_path))
    error_message = "The install_script_path must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "nomad_version" {
  description = "Nomad version cloud-init installs from HashiCorp's apt repository (package version <nomad_version>-1, then held)."
  type        = string
  default     = "1.11.0"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.nomad_version))
    error_message = "The nomad_version must be a release version such as 1.11.0."
  }
}

variable "consul_version" {
  description = "Consul version cloud-init installs from HashiCorp's apt repository (package version <consul_version>-1, then held)."
  type        = string
  default     = "1.22.0"

  validation {
    condition     = can(regex("^[0-9]+\\.[0-9]+\\.[0-9]+$", var.consul_version))
    error_message = "The consul_version must be a release version such as 1.22.0."
  }
}

# ---------------------------------------------------------------------------------------------
# Nomad client
# ---------------------------------------------------------------------------------------------

variable "node_name" {
  description = "Nomad client name (and Consul node name). Empty: the host name, as both agents default to."
  type        = string
  default     = ""

  validation {
    condition     = var.node_name == "" || can(regex("^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$", var.node_name))
    error_message = "The node_name must be empty or 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit."
  }
}

variable "region" {
  description = "Nomad region."
  type        = string
  default     = "global"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,128}$", var.region))
    error_message = "The region must be 1-128 letters, digits, '_' or '-'."
  }
}

variable "datacenter" {
  description = "Nomad datacenter of the client, and the Consul datacenter of the Consul client agent."
  type        = string
  default     = "dc1"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,128}$", var.datacenter))
    error_message = "The datacenter must be 1-128 letters, digits, '_' or '-'."
  }
}

variable "node_pool" {
  description = "Nomad node pool of the client. Jobs reach it with node_pool = \"<name>\"; Nomad creates the pool when the first client registers in it."
  type        = string
  default     = "gpu"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,128}$", var.node_pool)) && var.node_pool != "all"
    error_message = "The node_pool must be 1-128 letters, digits, '_' or '-', and not \"all\" (reserved by Nomad)."
  }
}

variable "node_class" {
  description = "Nomad node class (for example the GPU model); empty for none."
  type        = string
  default     = ""

  validation {
    condition     = var.node_class == "" || can(regex("^[A-Za-z0-9._-]{1,128}$", var.node_class))
    error_message = "The node_class must be empty or 1-128 letters, digits, '.', '_' or '-'."
  }
}

variable "meta" {
  description = "Nomad client meta (node.meta.<key> in constraints)."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k in keys(var.meta) : can(regex("^[A-Za-z0-9_][A-Za-z0-9._-]*$", k))])
    error_message = "The meta keys must be letters, digits, '.', '_' or '-' (not starting with '.' or '-')."
  }
}

variable "nomad_servers" {
  description = "What the client joins: server RPC addresses (host:port) or cloud auto-join strings (\"provider=aws tag_key=nomad-role tag_value=server\"). Empty: the client finds the servers through Consul (consul.client_auto_join)."
  type        = list(string)
  default     = []
}

variable "nomad_data_dir" {
  description = "Nomad client data_dir."
  type        = string
  default     = "/opt/nomad/data"

  validation {
    condition     = startswith(var.nomad_data_dir, "/") && !can(regex("[\\s'\"$`\\\\]", var.nomad_data_dir))
    error_message = "The nomad_data_dir must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "nomad_plugin_dir" {
  description = "Nomad plugin_dir: the install script puts nomad-driver-llm and nomad-device-gpu there."
  type        = string
  default     = "/opt/nomad/plugins"

  validation {
    condition     = startswith(var.nomad_plugin_dir, "/") && !can(regex("[\\s'\"$`\\\\]", var.nomad_plugin_dir))
    error_message = "The nomad_plugin_dir must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "nomad_config_dir" {
  description = "Directory of the Nomad agent's configuration files (the Debian package's nomad.service runs `nomad agent -config /etc/nomad.d`)."
  type        = string
  default     = "/etc/nomad.d"

  validation {
    condition     = startswith(var.nomad_config_dir, "/") && !can(regex("[\\s'\"$`\\\\]", var.nomad_config_dir))
    error_message = "The nomad_config_dir must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "nomad_bind_addr" {
  description = "Nomad bind_addr (a go-sockaddr template is allowed)."
  type        = string
  default     = "0.0.0.0"
}

variable "nomad_advertise_addr" {
  description = "Address the client advertises for http and rpc; empty lets Nomad pick the private address."
  type        = string
  default     = ""
}

variable "nomad_ports" {
  description = "Nomad agent ports."
  type = object({
    http = optional(number, 4646)
    rpc  = optional(number, 4647)
    serf = optional(number, 4648)
  })
  default = {}

  validation {
    condition     = alltrue([for p in values(var.nomad_ports) : p >= 1 && p <= 65535 && floor(p) == p])
    error_message = "The nomad_ports must be integers 1-65535."
  }
}

variable "nomad_network_interface" {
  description = "client.network_interface; empty lets Nomad pick the default route's interface."
  type        = string
  default     = ""
}

variable "nomad_dynamic_ports" {
  description = "client.min_dynamic_port / max_dynamic_port; null keeps Nomad's 20000-32000."
  type = object({
    min = number
    max = number
  })
  default = null

  validation {
    condition     = var.nomad_dynamic_ports == null || try(var.nomad_dynamic_ports.min >= 1024 && var.nomad_dynamic_ports.max <= 65535 && var.nomad_dynamic_ports.min < var.nomad_dynamic_ports.max, false)
    error_message = "The nomad_dynamic_ports must have 1024 <= min < max <= 65535."
  }
}

variable "nomad_client_options" {
  description = "client.options (for example fingerprint.denylist)."
  type        = map(string)
  default     = {}
}

variable "nomad_acl_enabled" {
  description = "acl.enabled on the client: on wherever the servers run with ACLs (clients authenticate with their node secret, no token needed here)."
  type        = bool
  default     = true
}

variable "nomad_log_level" {
  description = "Nomad log_level."
  type        = string
  default     = "INFO"

  validation {
    condition     = contains(["TRACE", "DEBUG", "INFO", "WARN", "ERROR"], var.nomad_log_level)
    error_message = "The nomad_log_level must be one of TRACE, DEBUG, INFO, WARN, ERROR."
  }
}

variable "nomad_tls" {
  description = "Nomad mTLS (tls { http, rpc }): PEM file paths on the node; null for none. The files themselves are not delivered by this module."
  type = object({
    ca_file                = string
    cert_file              = string
    key_file               = string
    verify_server_hostname = optional(bool, true)
  })
  default = null
}

variable "nomad_consul_token" {
  description = "Consul ACL token of the Nomad agent (consul.token). Empty leaves it out of user-data: deliver it another way (see README)."
  type        = string
  default     = ""
  sensitive   = true

  validation {
    condition     = var.nomad_consul_token == "" || can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", var.nomad_consul_token))
    error_message = "The nomad_consul_token must be empty or a Consul token secret (a UUID)."
  }
}

# ---------------------------------------------------------------------------------------------
# Oasis plugins
# ---------------------------------------------------------------------------------------------

variable "llm_engine_binaries" {
  description = "Engine executables for the llm driver's binaries map, beyond sim (which is <install_prefix>/bin/oasis-sim). Keys: vllm, sglang, llama_cpp, trtllm, sim."
  type        = map(string)
  default     = {}

  validation {
    condition     = alltrue([for k, v in var.llm_engine_binaries : contains(["vllm", "sglang", "llama_cpp", "trtllm", "sim"], k) && startswith(v, "/")])
    error_message = "The llm_engine_binaries keys must be vllm, sglang, llama_cpp, trtllm or sim, and the values absolute paths."
  }
}

variable "llm_fingerprint_period" {
  description = "The llm driver's fingerprint_period (Go duration, at least 1s)."
  type        = string
  default     = "30s"

  validation {
    condition     = can(regex("^[0-9]+(s|m|h)$", var.llm_fingerprint_period))
    error_message = "The llm_fingerprint_period must be a whole number of s, m or h, such as 30s."
  }
}

variable "gpu_device_plugin" {
  description = "Load the nomad-device-gpu device plugin (NVML fingerprint of the node's GPUs); the install script then requires it in the tarball."
  type        = bool
  default     = true
}

variable "gpu_ignored_ids" {
  description = "GPU or MIG UUIDs the device plugin never reports (ignored_gpu_ids)."
  type        = list(string)
  default     = []
}

variable "gpu_fingerprint_period" {
  description = "The device plugin's fingerprint_period."
  type        = string
  default     = "1m"

  validation {
    condition     = can(regex("^[0-9]+(s|m|h)$", var.gpu_fingerprint_period)) && !can(regex("^0+[smh]$", var.gpu_fingerprint_period))
    error_message = "The gpu_fingerprint_period must be a positive whole number of s, m or h, such as 1m."
  }
}

# ---------------------------------------------------------------------------------------------
# kvcached disk
# ---------------------------------------------------------------------------------------------

variable "kvcached_dir" {
  description = "Directory for kvcached's disk tier, exposed to jobs as the Nomad host volume kvcached_host_volume."
  type        = string
  default     = "/opt/oasis/kvcached"

  validation {
    condition     = startswith(var.kvcached_dir, "/") && !can(regex("[\\s'\"$`\\\\]", var.kvcached_dir))
    error_message = "The kvcached_dir must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "kvcached_host_volume" {
  description = "Name of the Nomad host volume for kvcached_dir."
  type        = string
  default     = "oasis-kvcached"

  validation {
    condition     = can(regex("^[A-Za-z0-9_-]{1,128}$", var.kvcached_host_volume))
    error_message = "The kvcached_host_volume must be 1-128 letters, digits, '_' or '-'."
  }
}

variable "kvcached_device" {
  description = "Block device for kvcached_dir (an attached NVMe or EBS volume, e.g. /dev/nvme1n1). The install script makes a filesystem on it only if it has none, mounts it (fstab by UUID, nofail). Empty: a plain directory on the root disk."
  type        = string
  default     = ""

  validation {
    condition     = var.kvcached_device == "" || can(regex("^/dev/[A-Za-z0-9/_.-]+$", var.kvcached_device))
    error_message = "The kvcached_device must be empty or a /dev/... path."
  }
}

variable "fstab_path" {
  description = "The fstab the install script adds kvcached_device to and mounts it from (tests point it at a file of their own)."
  type        = string
  default     = "/etc/fstab"

  validation {
    condition     = startswith(var.fstab_path, "/") && !can(regex("[\\s'\"$`\\\\]", var.fstab_path))
    error_message = "The fstab_path must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "kvcached_filesystem" {
  description = "Filesystem made on kvcached_device when it has none."
  type        = string
  default     = "xfs"

  validation {
    condition     = contains(["xfs", "ext4"], var.kvcached_filesystem)
    error_message = "The kvcached_filesystem must be xfs or ext4."
  }
}

# ---------------------------------------------------------------------------------------------
# Consul client agent
# ---------------------------------------------------------------------------------------------

variable "consul_retry_join" {
  description = "What the Consul client agent joins: serf LAN addresses or cloud auto-join strings (\"provider=gce tag_value=consul-server\")."
  type        = list(string)

  validation {
    condition     = length(var.consul_retry_join) > 0
    error_message = "The consul_retry_join must name at least one address or cloud auto-join string."
  }
}

variable "consul_config_dir" {
  description = "Directory of the Consul agent's configuration files (the Debian package's consul.service runs `consul agent -config-dir=/etc/consul.d/`)."
  type        = string
  default     = "/etc/consul.d"

  validation {
    condition     = startswith(var.consul_config_dir, "/") && !can(regex("[\\s'\"$`\\\\]", var.consul_config_dir))
    error_message = "The consul_config_dir must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "consul_data_dir" {
  description = "Consul agent data_dir."
  type        = string
  default     = "/opt/consul"

  validation {
    condition     = startswith(var.consul_data_dir, "/") && !can(regex("[\\s'\"$`\\\\]", var.consul_data_dir))
    error_message = "The consul_data_dir must be an absolute path without spaces, quotes, $, ` or backslashes."
  }
}

variable "consul_bind_addr" {
  description = "Consul bind_addr (go-sockaddr template allowed)."
  type        = string
  default     = "{{ GetPrivateIP }}"
}

variable "consul_client_addr" {
  description = "Consul client_addr: where its HTTP API listens (Nomad talks to it there)."
  type        = string
  default     = "127.0.0.1"
}

variable "consul_ports" {
  description = "Consul agent ports; -1 turns one off."
  type = object({
    http     = optional(number, 8500)
    https    = optional(number, -1)
    grpc     = optional(number, 8502)
    grpc_tls = optional(number, -1)
    dns      = optional(number, 8600)
    serf_lan = optional(number, 8301)
  })
  default = {}

  validation {
    condition     = alltrue([for p in values(var.consul_ports) : (p == -1 || (p >= 1 && p <= 65535)) && floor(p) == p]) && var.consul_ports.serf_lan > 0 && (var.consul_ports.http > 0 || var.consul_ports.https > 0)
    error_message = "The consul_ports must be integers 1-65535 or -1 (off); serf_lan and one of http or https must be on."
  }
}

variable "consul_nomad_address" {
  description = "Consul HTTP address the Nomad agent uses (consul.address). Empty: <consul_client_addr>:<consul_ports.https or http>."
  type        = string
  default     = ""
}

variable "consul_acl_enabled" {
  description = "ACLs on the Consul client agent (default_policy deny), as on the servers."
  type        = bool
  default     = true
}

variable "consul_agent_token" {
  description = "ACL token of the Consul client agent (acl.tokens.agent). Empty leaves it out of user-data: deliver it another way (see README)."
  type        = string
  default     = ""
  sensitive   = true

  validation {
    condition     = var.consul_agent_token == "" || can(regex("^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$", var.consul_agent_token))
    error_message = "The consul_agent_token must be empty or a Consul token secret (a UUID)."
  }
}

variable "consul_gossip_key" {
  description = "Consul gossip encryption key (encrypt), base64 of 16 or 32 bytes (consul keygen). Empty: no gossip encryption in user-data (deliver it another way, see README)."
  type        = string
  default     = ""
  sensitive   = true

  validation {
    condition     = var.consul_gossip_key == "" || (can(base64decode(var.consul_gossip_key)) && contains([24, 44], length(var.consul_gossip_key)))
    error_message = "The consul_gossip_key must be empty or the base64 of 16 or 32 bytes (`consul keygen`)."
  }
}

variable "consul_tls" {
  description = "Consul agent TLS (tls.defaults): PEM file paths on the node; null for none. With https on, Nomad's consul block uses https with the same CA."
  type = object({
    ca_file         = string
    cert_file       = optional(string, "")
    key_file        = optional(string, "")
    verify_outgoing = optional(bool, true)
  })
  default = null
}

variable "consul_log_level" {
  description = "Consul log_level."
  type        = string
  default     = "INFO"

  validation {
    condition     = contains(["TRACE", "DEBUG", "INFO", "WARN", "ERR"], var.consul_log_level)
    error_message = "The consul_log_level must be one of TRACE, DEBUG, INFO, WARN, ERR."
  }
}
