# oasis-router: the OpenAI-compatible gateway, one per node (system job). Clients talk to the
# router on their node; the router finds engines in Consul (service "oasis-engine") and reads its
# routing policy from Consul KV (<kv_prefix>/policy), writing the default policy when absent.
#
#   nomad job run jobs/router.nomad.hcl
#   nomad job run -var 'http_port=8080' -var 'oasis_bin_dir=/opt/oasis/bin' jobs/router.nomad.hcl

variable "datacenters" {
  description = "Datacenters the router runs in."
  type        = list(string)
  default     = ["*"]
}

variable "oasis_bin_dir" {
  description = "Directory holding the oasis-router binary on every node."
  type        = string
  default     = "/usr/local/bin"
}

variable "http_port" {
  description = "Static port the OpenAI API listens on, on every node."
  type        = number
  default     = 8080
}

variable "bind_address" {
  description = "Address the API binds to. Loopback by default: set the node's address to serve other hosts."
  type        = string
  default     = "127.0.0.1"
}

variable "consul_addr" {
  description = "Consul HTTP address the router watches (engines, policy)."
  type        = string
  default     = "127.0.0.1:8500"
}

variable "nomad_addr" {
  description = "Nomad HTTP address the router reads GPU power (the device plugin's stats) from."
  type        = string
  default     = "http://127.0.0.1:4646"
}

variable "kv_prefix" {
  description = "Consul KV prefix: <prefix>/policy holds the routing policy, <prefix>/keys the API keys."
  type        = string
  default     = "oasis/router"
}

variable "api_keys_kv" {
  description = "Require API keys, read (as sha256 digests) from Consul KV <kv_prefix>/keys."
  type        = bool
  default     = false
}

variable "cpu" {
  type    = number
  default = 500
}

variable "memory" {
  type    = number
  default = 256
}

job "oasis-router" {
  datacenters = var.datacenters
  type        = "system"

  update {
    max_parallel     = 1
    min_healthy_time = "10s"
    healthy_deadline = "2m"
    auto_revert      = true
  }

  group "router" {
    network {
      port "http" {
        static = var.http_port
      }
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    service {
      name     = "oasis-router"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "openai"]
      meta {
        oasis_node = "${node.unique.id}"
      }
      # Liveness, not readiness: /ready is 503 while no engine is up, which must not fail a
      # deployment of the router itself.
      check {
        name     = "health"
        type     = "http"
        path     = "/health"
        interval = "5s"
        timeout  = "2s"
      }
    }

    task "router" {
      driver = "raw_exec"

      config {
        command = "${var.oasis_bin_dir}/oasis-router"
        args = [
          "-listen", "${var.bind_address}:${NOMAD_PORT_http}",
          "-consul-addr", var.consul_addr,
          "-kv-prefix", var.kv_prefix,
          "-api-keys-kv=${var.api_keys_kv}",
          "-nomad-addr", var.nomad_addr,
          "-power-from-nomad",
          "-log-json",
        ]
      }

      # Drain in-flight streams on stop (the router waits up to -shutdown-timeout).
      kill_signal  = "SIGTERM"
      kill_timeout = "65s"

      resources {
        cpu    = var.cpu
        memory = var.memory
      }
    }
  }
}
