# oasis-kvcached: the node-local tiered KV block store (RAM -> SSD -> peers over QUIC), one per
# node (system job). Engines with kv_offload = "kvcached" reach it through LMCache's redis://
# remote tier on the node's loopback; peers find each other in Consul (service
# "oasis-kvcached", meta oasis_quic_port) and fetch over QUIC with mutual TLS.
#
#   nomad job run jobs/kvcached.nomad.hcl
#
# TLS material for peers: put the CA, certificate and key in Nomad Variables at
# nomad/jobs/oasis-kvcached (items ca, cert, key) and set peers_enabled = true; the template
# blocks below write them into the task's secrets dir. Without them kvcached runs without peers.
#
# Service mesh (mesh = true, with peers_enabled): no TLS material in Nomad Variables; each
# kvcached takes its Connect leaf certificate for service oasis-kvcached from the node's Consul
# agent (--mesh), verifies that peers are oasis-kvcached, and lets callers in by Consul intentions
# (source oasis-kvcached, destination oasis-kvcached must be allowed; with ACLs the default
# denies), checked again on every request so a deny reaches open connections. The service is
# registered Connect-native. Its token (the oasis-kvcached role of jobs/acl/setup.sh) needs
# service:write on oasis-kvcached. Consul's address, and its TLS settings if any, come from what
# Nomad injects for a Connect-native task (CONSUL_HTTP_ADDR, CONSUL_HTTP_SSL*, CONSUL_HTTP_TOKEN).
#
# Redis password (auth_enabled, on by default): put it in a variable of its own,
# nomad/jobs/oasis-kvcached/kvcached (item redis_password), the task group's variable, which this
# job's tasks read without a policy. Engines get it through a kvcached KV offload tier that
# references this item, and their policy (jobs/acl/nomad-oasis-tiers.hcl) may read this variable
# alone, not the job's variable with the TLS key and Consul token (jobs/README.md). A template
# writes it into the task's secrets dir and kvcached reads it from there (--password-file), so it
# never appears in the job, its arguments or its environment.
#
# Peers in other datacenters (peer_datacenters, off by default; kvcached/README.md says why): the
# task's Consul token must be valid in those datacenters. A workload identity's login token is
# local to its datacenter, and Consul runs a ?dc= query made with a local token as the anonymous
# token there (an empty answer, no error), so with peer_datacenters set the job reads a global
# token with the oasis-kvcached policy from the same variable (item consul_token) and kvcached
# uses it (CONSUL_HTTP_TOKEN_FILE). Without the item the file is empty and kvcached keeps the
# local token, and warns at start that it is not valid in the remote datacenters. jobs/README.md
# shows how to make the token.
#
# KV-event sockets (ZMQ PUB and ROUTER, no authentication) bind to the node's address
# (attr.unique.network.ip-address) unless kv_events_address names another: routers on other
# nodes subscribe to them, so they cannot be on loopback; keep that address private.

variable "region" {
  description = "Nomad region the job runs in (jobs/README.md runs it in every region)."
  type        = string
  default     = "global"
}

variable "datacenters" {
  type    = list(string)
  default = ["*"]
}

variable "oasis_bin_dir" {
  description = "Directory holding the oasis-kvcached binary on every node."
  type        = string
  default     = "/usr/local/bin"
}

variable "artifact_url" {
  description = "URL of a release tarball (make dist: oasis_<version>_linux_<arch>.tar.gz) Nomad fetches into the task's local/oasis and runs oasis-kvcached from. Empty: the binary pre-placed in oasis_bin_dir runs."
  type        = string
  default     = ""
}

variable "artifact_checksum" {
  description = "Checksum of artifact_url, sha256:<hex> (its line in the release's SHA256SUMS). Required with artifact_url: Nomad refuses a download that does not match."
  type        = string
  default     = ""

  validation {
    condition     = var.artifact_checksum == "" || (strlen(var.artifact_checksum) == 71 && substr(var.artifact_checksum, 0, 7) == "sha256:")
    error_message = "The artifact_checksum must be sha256:<64 hex digits>."
  }
}

variable "resp_port" {
  description = "Static Redis-protocol port on every node (the llm driver's default kvcached_address is 127.0.0.1:6380)."
  type        = number
  default     = 6380
}

variable "http_port" {
  description = "Static port of /metrics and /health."
  type        = number
  default     = 9380
}

variable "quic_port" {
  description = "Static UDP port peers fetch blocks on."
  type        = number
  default     = 9381
}

variable "bind_address" {
  description = "Address the Redis protocol binds to. Loopback: only engines on the node use it."
  type        = string
  default     = "127.0.0.1"
}

variable "ram_bytes" {
  description = "kvcached's memory budget (--ram-bytes): the RAM tier plus in-flight values; RSS stays within it + 10%."
  type        = string
  default     = "4GiB"
}

variable "disk_bytes" {
  description = "SSD tier size; 0 disables the disk tier."
  type        = string
  default     = "64GiB"
}

variable "data_dir" {
  description = "Directory of the SSD tier on the node (kept across restarts)."
  type        = string
  default     = "/var/lib/oasis-kvcached"
}

variable "consul_addr" {
  type    = string
  default = "127.0.0.1:8500"
}

variable "peers_enabled" {
  description = "Serve and fetch from peers over QUIC (needs the TLS material described above)."
  type        = bool
  default     = false
}

variable "mesh" {
  description = "Peers take their mutual-TLS identity from Consul Connect (--mesh) instead of the TLS material in Nomad Variables; the service is registered Connect-native and intentions decide which callers get in (see the top of this file). Needs peers_enabled."
  type        = bool
  default     = false
}

variable "auth_enabled" {
  description = "Require the Redis password in Nomad variable nomad/jobs/oasis-kvcached/kvcached, item redis_password (the task waits for it). On by default: engines get the password through a kvcached KV offload tier (jobs/README.md). false leaves the Redis port open to every process that reaches it."
  type        = bool
  default     = true
}

variable "kv_events_address" {
  description = "Address the KV-event sockets (ZMQ PUB and ROUTER, unauthenticated) bind to and advertise; empty: the node's address, attr.unique.network.ip-address. Routers on other nodes must reach it."
  type        = string
  default     = ""
}

variable "peer_verify_address" {
  description = "Peers verify that each node's certificate names its address (--tls-verify-address) instead of the shared name oasis-kvcached, so a node cannot pose as another. Needs a certificate per node with its address as IP SAN (Vault PKI, see kvcached/README.md)."
  type        = bool
  default     = false
}

variable "peer_datacenters" {
  description = "Remote Consul datacenters whose oasis-kvcached instances are peers too, asked only after local peers miss (--peer-datacenters). Empty by default: recomputing a long prefix is faster than moving its KV cache over a WAN (kvcached/README.md). Needs peers_enabled and a global Consul token in item consul_token."
  type        = list(string)
  default     = []
}

variable "peer_wan_bytes_per_second" {
  description = "Block bytes each node may pull from each remote datacenter per second (--peer-wan-bytes-per-second; token bucket with one second of burst, a fetch over it is a miss). 0: no cap."
  type        = string
  default     = "100MiB"
}

variable "peer_wan_timeout" {
  description = "Timeout of one block fetch from a remote datacenter's peer (--peer-wan-timeout)."
  type        = string
  default     = "5s"
}

variable "memory_mb" {
  description = "Task memory: at least ram_bytes + 10%."
  type        = number
  default     = 4608
}

locals {
  # The artifact (when set) unpacks into local/oasis; raw_exec runs a path relative to the
  # allocation's task directory. The checksum is mandatory: go-getter skips the check when empty.
  bin_dir = var.artifact_url == "" ? var.oasis_bin_dir : (
    var.artifact_checksum != "" ? "local/oasis" : file("artifact_checksum is required with artifact_url")
  )
  kv_events_address = var.kv_events_address != "" ? var.kv_events_address : "$${attr.unique.network.ip-address}"
  # The same in the config file below, which Nomad's template renders: node attributes through env.
  kv_events_host = var.kv_events_address != "" ? var.kv_events_address : "{{ env \"attr.unique.network.ip-address\" }}"
  mesh           = var.peers_enabled && var.mesh
  wan_enabled    = var.peers_enabled && length(var.peer_datacenters) > 0

  # kvcached's config file (kvcached/README.md "Configuration"), rendered from the variables
  # above into local/kvcached.hcl. Nomad fills in {{ env "..." }} when the task starts.
  kvcached_config = <<EOT
listeners {
  resp = "${var.bind_address}:${var.resp_port}"
  http = "${var.bind_address}:${var.http_port}"
%{~if var.peers_enabled}
  quic = "${var.bind_address == "127.0.0.1" ? "0.0.0.0" : var.bind_address}:${var.quic_port}"
%{~endif}
}

tiers {
  ram {
    bytes = ${jsonencode(var.ram_bytes)}
  }
  disk {
    bytes = ${jsonencode(var.disk_bytes)}
    dir   = ${jsonencode(var.data_dir)}
  }
}
%{~if var.peers_enabled && !var.mesh}

tls {
  ca             = "secrets/ca.pem"
  cert           = "secrets/cert.pem"
  key            = "secrets/key.pem"
  verify_address = ${var.peer_verify_address}
}
%{~endif}
%{~if var.peers_enabled}

peers {
%{~if local.mesh}
  # Consul's address is the one Nomad injects for a Connect-native task (CONSUL_HTTP_ADDR).
  mesh = true
%{~else}
  consul_addr = ${jsonencode(var.consul_addr)}
%{~endif}
%{~if local.wan_enabled}
  datacenters          = ${jsonencode(var.peer_datacenters)}
  wan_bytes_per_second = ${jsonencode(var.peer_wan_bytes_per_second)}
  wan_timeout          = ${jsonencode(var.peer_wan_timeout)}
%{~endif}
}
%{~endif}
%{~if var.auth_enabled}

auth {
  password_file = "secrets/redis-password"
}
%{~endif}

telemetry {
  kv_events {
    endpoint        = "tcp://${local.kv_events_host}:{{ env "NOMAD_PORT_kv_events" }}"
    replay_endpoint = "tcp://${local.kv_events_host}:{{ env "NOMAD_PORT_kv_events_replay" }}"
  }
}
EOT
}

job "oasis-kvcached" {
  region      = var.region
  datacenters = var.datacenters
  type        = "system"

  update {
    max_parallel     = 1
    min_healthy_time = "10s"
    healthy_deadline = "2m"
    auto_revert      = true
  }

  group "kvcached" {
    network {
      # Stated, though it is the default: Nomad hands a Connect-native task CONSUL_HTTP_ADDR
      # only when the group's mode is explicit.
      mode = "host"
      port "resp" {
        static = var.resp_port
      }
      port "http" {
        static = var.http_port
      }
      port "kv_events" {}
      port "kv_events_replay" {}
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    # With the mesh this one service is Connect-native rather than a second registration on the
    # QUIC port: every consumer of oasis-kvcached in the catalog (peers, routers, operators'
    # tools) reads this entry, its Redis port and its meta, and peers dial oasis_quic_port.
    service {
      name     = "oasis-kvcached"
      provider = "consul"
      port     = "resp"
      task     = "kvcached"
      tags     = ["oasis", "redis"]
      meta {
        oasis_quic_port        = "${var.quic_port}"
        oasis_metrics_addr     = "${NOMAD_ADDR_http}"
        oasis_kv_events        = "tcp://${local.kv_events_address}:${NOMAD_PORT_kv_events}"
        oasis_kv_events_replay = "tcp://${local.kv_events_address}:${NOMAD_PORT_kv_events_replay}"
        oasis_node             = "${node.unique.id}"
      }
      dynamic "connect" {
        for_each = local.mesh ? ["native"] : []
        content {
          native = true
        }
      }
      check {
        name     = "health"
        type     = "http"
        port     = "http"
        path     = "/health"
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "kvcached" {
      driver = "raw_exec"

      # Fetched and checked before the task starts; a wrong checksum fails the task's start.
      dynamic "artifact" {
        for_each = var.artifact_url == "" ? [] : [var.artifact_url]
        content {
          source      = artifact.value
          destination = "local/oasis"
          options {
            checksum = var.artifact_checksum
          }
        }
      }


      # With peers, kvcached finds the others in Consul: Nomad logs the task's workload identity
      # in and hands it the token as CONSUL_HTTP_TOKEN, bound by jobs/acl/setup.sh to the
      # oasis-kvcached role (jobs/acl/consul-oasis-kvcached.hcl). Without peers it asks Consul
      # nothing and gets no token.
      dynamic "consul" {
        for_each = var.peers_enabled ? ["peers"] : []
        content {}
      }

      config {
        command = "${local.bin_dir}/oasis-kvcached"
        args    = ["--config", "${NOMAD_TASK_DIR}/kvcached.hcl"]
      }

      # Every setting is in the config file rendered from the variables (local.kvcached_config);
      # kvcached reads it once at start, so a change restarts it.
      template {
        data        = local.kvcached_config
        destination = "local/kvcached.hcl"
        change_mode = "restart"
      }

      # With remote datacenters: the global token (see the top of this file). The file wins over
      # the workload identity's CONSUL_HTTP_TOKEN; a new token restarts the task, which reads it
      # once at start.
      env {
        CONSUL_HTTP_TOKEN_FILE = local.wan_enabled ? "secrets/consul-token" : ""
      }

      dynamic "template" {
        for_each = local.wan_enabled ? ["consul_token"] : []
        content {
          destination = "secrets/consul-token"
          perms       = "0600"
          change_mode = "restart"
          data        = "{{ with nomadVar \"nomad/jobs/oasis-kvcached\" }}{{ .consul_token }}{{ end }}"
        }
      }

      # The password is in the group's variable, apart from the TLS material and the Consul token:
      # engines may read it (jobs/acl/nomad-oasis-tiers.hcl), not those.
      # kvcached reads the password file at start and again on SIGHUP: a changed password takes
      # effect without a restart (which would empty the RAM tier); connections that already
      # authenticated stay open.
      dynamic "template" {
        for_each = var.auth_enabled ? ["redis_password"] : []
        content {
          destination   = "secrets/redis-password"
          perms         = "0600"
          change_mode   = "signal"
          change_signal = "SIGHUP"
          data          = "{{ with nomadVar \"nomad/jobs/oasis-kvcached/kvcached\" }}{{ .redis_password }}{{ end }}"
        }
      }

      dynamic "template" {
        for_each = var.peers_enabled && !var.mesh ? ["ca", "cert", "key"] : []
        content {
          destination = "secrets/${template.value}.pem"
          perms       = "0600"
          data        = "{{ with nomadVar \"nomad/jobs/oasis-kvcached\" }}{{ .${template.value} }}{{ end }}"
        }
      }

      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 500
        memory = var.memory_mb
      }
    }
  }
}
