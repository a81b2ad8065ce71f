# oasis-router: the OpenAI-compatible gateway, one per node (system job). Clients talk to the
# router on their node; the router finds engines in Consul (service "oasis-engine") and reads its
# routing policy from Consul KV (<kv_prefix>/policy), writing the default policy when absent.
#
#   nomad job run jobs/router.nomad.hcl
#   nomad job run -var 'http_port=8080' -var 'oasis_bin_dir=/opt/oasis/bin' jobs/router.nomad.hcl
#   nomad job run -var 'tls_enabled=true' jobs/router.nomad.hcl   # certificate from a Nomad variable
#
# jobs/README.md says how to put the TLS certificate into the Nomad variable and what hosted
# upstreams the router must be told to allow.

variable "region" {
  description = "Nomad region the job runs in (jobs/README.md runs it in every region)."
  type        = string
  default     = "global"
}

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

variable "artifact_url" {
  description = "URL of a release tarball (make dist: oasis_<version>_linux_<arch>.tar.gz) Nomad fetches into the task's local/oasis and runs oasis-router from. Empty: the binary pre-placed in oasis_bin_dir runs."
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

variable "response_id_key" {
  description = "Authenticate Responses API ids with the key in the Nomad variable secrets_variable (item response_id_key, at least 32 bytes), the same for every replica: an id then leads to its engine from any router, after restarts too. Off, each router process has a random key (one replica only)."
  type        = bool
  default     = false
}

variable "peers_enabled" {
  description = "Share admission (max_in_flight), key limits and engine load with the datacenter's other routers (router/README.md \"Routers of a datacenter\"): gossip on the port peers at the node's address, encrypted with the key in the Nomad variable secrets_variable (item peers_key: base64 of 32 bytes, openssl rand -base64 32). Off, each router counts the routers registered in Consul and enforces its even share of the limits (cap ÷ routers): the datacenter never admits more than the policy's limits, but slots do not move to the routers with the demand."
  type        = bool
  default     = false
}

variable "peers_interval" {
  description = "With peers_enabled, the longest time between two load messages of a router (its heartbeat; at most 10s)."
  type        = string
  default     = "200ms"

  validation {
    condition     = regex_replace(var.peers_interval, "^[1-9][0-9]*(ms|s)$", "") == ""
    error_message = "The peers_interval must be a whole number of ms or s, e.g. 200ms."
  }
}

variable "peers_min_interval" {
  description = "With peers_enabled, the shortest time between two load messages of a router: it sends its load as soon as its requests on an engine change, and changes within this time go out together (at most peers_interval)."
  type        = string
  default     = "10ms"

  validation {
    condition     = regex_replace(var.peers_min_interval, "^[1-9][0-9]*(ms|s)$", "") == ""
    error_message = "The peers_min_interval must be a whole number of ms or s, e.g. 10ms."
  }
}

variable "peers_port" {
  description = "Static gossip port (TCP and UDP) with peers_enabled; 0: a dynamic port, registered in the service meta oasis_peers."
  type        = number
  default     = 0
}

variable "tls_enabled" {
  description = "Serve the API over TLS (HTTP/1.1 and HTTP/2) with the certificate and key in the Nomad variable secrets_variable (items tls_cert, tls_key). Off, the job needs no variable."
  type        = bool
  default     = false
}

variable "tls_mutual" {
  description = "With tls_enabled, also require client certificates signed by a CA in the variable's item tls_client_ca (mutual TLS). The Consul check is then a TCP check: Consul has no client certificate."
  type        = bool
  default     = false
}

variable "secrets_variable" {
  description = "Nomad variable holding the router's secrets: the PEM items tls_cert, tls_key and tls_client_ca, and one item per hosted key (named as its environment variable in hosted_key_envs). The job's tasks may read nomad/jobs/<job id> without a policy."
  type        = string
  default     = "nomad/jobs/oasis-router"
}

variable "federation_enabled" {
  description = "Serve other datacenters' routers over HTTP/3 with mutual TLS on the UDP port federation_port, and register it in Consul as oasis-router-federation. Certificates come from the Nomad variable secrets_variable (items federation_tls_cert, federation_tls_key, federation_tls_ca). Requests leave the datacenter only when the policy's federation section enables it."
  type        = bool
  default     = false
}

variable "federation_port" {
  description = "UDP port of the federation listener (HTTP/3)."
  type        = number
  default     = 8443
}

variable "federation_dc" {
  description = "This router's Consul datacenter, registered as meta oasis_dc (must be the datacenter the registration lands in: peers refuse any other)."
  type        = string
  default     = "dc1"
}

variable "federation_models" {
  description = "Models this datacenter serves, registered as meta oasis_models (letters, digits and ._-:/@; at most 64)."
  type        = list(string)
  default     = []
}

variable "mesh_enabled" {
  description = "Join the Consul service mesh: the router's identity is its Connect leaf certificate (service oasis-router), the API is also served Connect-native on the port mesh (intentions decide who may call it: jobs/mesh), engines are reached only at their sidecars (or Connect-native listeners), and the federation link, when on, uses the same identity instead of the federation_tls_* items."
  type        = bool
  default     = false
}

variable "mesh_plain_listener" {
  description = "With mesh_enabled, also serve clients outside the mesh on http_port (plain or tls_enabled). Off, only mesh clients reach the router."
  type        = bool
  default     = true
}

variable "hosted_upstreams" {
  description = "Hosted OpenAI-compatible base URLs engines may name in oasis_upstream (https; exact, or with a leading *. host label, e.g. https://*.openai.azure.com/openai). Registrations naming others are ignored."
  type        = list(string)
  default     = []
}

variable "hosted_key_envs" {
  description = "Environment variables of the router whose value engines may ask to be sent as the hosted API key (oasis_upstream_key_env): NAME, or NAME=URL pattern to bind it to upstreams. Each NAME is set from the item NAME of the Nomad variable secrets_variable."
  type        = list(string)
  default     = []
}

variable "max_connections" {
  description = "Most client connections served at once (0: no limit): at the cap the connection idle longest is closed; with none idle, further ones wait in the kernel's accept queue."
  type        = number
  default     = 4096
}

variable "max_connections_per_source" {
  description = "Most client connections from one IPv4 address or IPv6 /64 (0: no limit): past it the source's idle connection is closed, else the new one. Raise it (or 0) when a load balancer or NAT shows every client as one address."
  type        = number
  default     = 1024
}

variable "otlp_endpoint" {
  description = "OTLP/HTTP receiver (e.g. an OpenTelemetry Collector or Jaeger) the router exports request traces to, http(s)://host:port[/path] (path default /v1/traces). Empty: no tracing."
  type        = string
  default     = ""

  validation {
    # Nomad's HCL has regex_replace, not regex: a valid URL (or "") leaves nothing.
    condition     = regex_replace(var.otlp_endpoint, "^https?://[^/:]+:[0-9]+(/.*)?$", "") == ""
    error_message = "The otlp_endpoint must be http(s)://host:port[/path]."
  }
}

variable "trace_sample_ratio" {
  description = "With otlp_endpoint, the share of new traces the router samples, 0 to 1 (5% by default, inside the 1-10% BENCHMARKS.md recommends; 1 while debugging). A client's traceparent decides for its own trace."
  type        = number
  default     = 0.05

  validation {
    condition     = var.trace_sample_ratio >= 0 && var.trace_sample_ratio <= 1
    error_message = "The trace_sample_ratio must be from 0 to 1."
  }
}

variable "cpu" {
  type    = number
  default = 500
}

variable "memory" {
  type    = number
  default = 256
}

locals {
  # The artifact (when set) unpacks into local/oasis; raw_exec runs a path relative to the
  # allocation's task directory. The checksum is mandatory: go-getter skips the check when empty.
  bin_dir = var.artifact_url == "" ? var.oasis_bin_dir : (
    var.artifact_checksum != "" ? "local/oasis" : file("artifact_checksum is required with artifact_url")
  )
  tls_files = concat(
    var.tls_enabled ? [{ item = "tls_cert", file = "cert.pem" }, { item = "tls_key", file = "key.pem" }] : [],
    var.tls_enabled && var.tls_mutual ? [{ item = "tls_client_ca", file = "client-ca.pem" }] : [],
    var.federation_enabled && !var.mesh_enabled ? [{ item = "federation_tls_cert", file = "federation-cert.pem" },
      { item = "federation_tls_key", file = "federation-key.pem" },
    { item = "federation_tls_ca", file = "federation-ca.pem" }] : [],
  )
  hosted_key_names = [for e in var.hosted_key_envs : split("=", e)[0]]
  plain_listener   = !var.mesh_enabled || var.mesh_plain_listener

  # The router's config file (router/README.md "Configuration"), rendered from the variables
  # above into local/router.hcl. Nomad fills in {{ env "..." }} when the task starts.
  router_config = <<EOT
log_json = true

listeners {
  api = "${local.plain_listener ? "${var.bind_address}:${var.http_port}" : "off"}"
}
%{~if var.tls_enabled}

tls {
  cert = "{{ env "NOMAD_SECRETS_DIR" }}/tls/cert.pem"
  key  = "{{ env "NOMAD_SECRETS_DIR" }}/tls/key.pem"
%{~if var.tls_mutual}
  client_ca = "{{ env "NOMAD_SECRETS_DIR" }}/tls/client-ca.pem"
%{~endif}
}
%{~endif}

discovery {
  consul_addr      = ${jsonencode(var.consul_addr)}
  nomad_addr       = ${jsonencode(var.nomad_addr)}
  hosted_upstreams = ${jsonencode(var.hosted_upstreams)}
  hosted_key_envs  = ${jsonencode(var.hosted_key_envs)}
}

policy {
  kv_prefix   = ${jsonencode(var.kv_prefix)}
  api_keys_kv = ${var.api_keys_kv}
%{~if var.response_id_key}
  response_id_key_file = "{{ env "NOMAD_SECRETS_DIR" }}/response-id-key"
%{~endif}
}
%{~if var.mesh_enabled}

mesh {
  service = "oasis-router"
  listen  = "${var.bind_address}:{{ env "NOMAD_PORT_mesh" }}"
  engines = true
}
%{~endif}


# The node lets the router find its own registration (meta oasis_node) among the routers it
# counts; without peers_enabled it keeps its even share of the limits (cap ÷ routers).
peers {
  node         = "{{ env "node.unique.id" }}"
%{~if var.peers_enabled}
  listen       = "{{ env "NOMAD_IP_peers" }}:{{ env "NOMAD_PORT_peers" }}"
  key_file     = "{{ env "NOMAD_SECRETS_DIR" }}/peers-key"
  interval     = ${jsonencode(var.peers_interval)}
  min_interval = ${jsonencode(var.peers_min_interval)}
%{~endif}
}
%{~if var.federation_enabled}

federation {
  listen     = "${var.bind_address}:${var.federation_port}"
  datacenter = ${jsonencode(var.federation_dc)}
%{~if !var.mesh_enabled}
  tls_cert   = "{{ env "NOMAD_SECRETS_DIR" }}/tls/federation-cert.pem"
  tls_key    = "{{ env "NOMAD_SECRETS_DIR" }}/tls/federation-key.pem"
  tls_ca     = "{{ env "NOMAD_SECRETS_DIR" }}/tls/federation-ca.pem"
%{~endif}
}
%{~endif}

limits {
  max_connections            = ${var.max_connections}
  max_connections_per_source = ${var.max_connections_per_source}
}

telemetry {
  metrics {
    power_from_nomad = true
  }
  tracing {
    otlp_endpoint = ${jsonencode(var.otlp_endpoint)}
    sample_ratio  = ${var.trace_sample_ratio}
  }
}
EOT
}

job "oasis-router" {
  region      = var.region
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
      # Stated, not defaulted: Nomad gives a Connect-native task CONSUL_HTTP_ADDR only then.
      mode = "host"
      dynamic "port" {
        for_each = local.plain_listener ? ["http"] : []
        labels   = [port.value]
        content {
          static = var.http_port
        }
      }
      dynamic "port" {
        for_each = var.mesh_enabled ? ["mesh"] : []
        labels   = [port.value]
        content {}
      }
      dynamic "port" {
        for_each = var.peers_enabled && var.peers_port > 0 ? ["peers"] : []
        labels   = [port.value]
        content {
          static = var.peers_port
        }
      }
      dynamic "port" {
        for_each = var.peers_enabled && var.peers_port == 0 ? ["peers"] : []
        labels   = [port.value]
        content {}
      }
      dynamic "port" {
        for_each = var.federation_enabled ? ["federation"] : []
        labels   = [port.value]
        content {
          static = var.federation_port
        }
      }
    }

    restart {
      attempts = 10
      interval = "5m"
      delay    = "5s"
      mode     = "delay"
    }

    dynamic "service" {
      for_each = local.plain_listener ? ["http"] : []
      content {
        name     = "oasis-router"
        provider = "consul"
        port     = "http"
        tags     = ["oasis", "openai"]
        meta {
          oasis_node = "${node.unique.id}"
          # The gossip address the datacenter's other routers join (router/peers).
          oasis_peers = var.peers_enabled ? "${NOMAD_ADDR_peers}" : ""
        }
        # Liveness, not readiness: /ready is 503 while no engine is up, which must not fail a
        # deployment of the router itself. Over TLS Consul does not verify the router's
        # certificate (its CA is the operator's); with mutual TLS it cannot present a client
        # certificate, so the check only connects.
        dynamic "check" {
          for_each = var.tls_enabled && var.tls_mutual ? [] : ["health"]
          content {
            name            = "health"
            type            = "http"
            protocol        = var.tls_enabled ? "https" : "http"
            tls_skip_verify = var.tls_enabled
            path            = "/health"
            interval        = "5s"
            timeout         = "2s"
          }
        }
        dynamic "check" {
          for_each = var.tls_enabled && var.tls_mutual ? ["listening"] : []
          content {
            name     = "listening"
            type     = "tcp"
            interval = "5s"
            timeout  = "2s"
          }
        }
      }
    }

    # The API for mesh clients, Connect-native: the router terminates mutual TLS with its own
    # leaf certificate and asks Consul's intentions about each caller (no sidecar in front, so
    # its per-instance routing stays its own). Consul's check cannot present a mesh
    # certificate: it only connects.
    dynamic "service" {
      for_each = var.mesh_enabled ? ["mesh"] : []
      content {
        name     = "oasis-router"
        provider = "consul"
        port     = "mesh"
        task     = "router"
        tags     = ["oasis", "openai", "mesh"]
        meta {
          oasis_node = "${node.unique.id}"
        }
        connect {
          native = true
        }
        check {
          name     = "listening"
          type     = "tcp"
          interval = "5s"
          timeout  = "2s"
        }
      }
    }

    # Other datacenters' routers find this one here (router/federation): meta is what they route
    # by, and they refuse an entry whose oasis_dc is not the datacenter they asked. HTTP/3 has no
    # Consul check; a dead listener shows as failed summary pushes and opens peers' breakers.
    dynamic "service" {
      for_each = var.federation_enabled ? ["federation"] : []
      content {
        name     = "oasis-router-federation"
        provider = "consul"
        port     = "federation"
        tags     = ["oasis"]
        meta {
          oasis_dc     = var.federation_dc
          oasis_models = join(",", var.federation_models)
        }
      }
    }

    task "router" {
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

      # Consul: Nomad logs the task's workload identity in to Consul and hands the router the
      # token as CONSUL_HTTP_TOKEN; jobs/acl/setup.sh binds it to the oasis-router role
      # (jobs/acl/consul-oasis-router.hcl). Without Consul ACLs it is a no-op.
      consul {}

      # Nomad: the workload identity itself as NOMAD_TOKEN, carrying the policy jobs/acl/setup.sh
      # attaches to this job (jobs/acl/nomad-oasis-router.hcl: node read, for GPU power).
      identity {
        env = true
      }

      config {
        command = "${local.bin_dir}/oasis-router"
        args    = ["-config", "${NOMAD_TASK_DIR}/router.hcl"]
      }

      # Every setting is in the config file rendered from the variables (local.router_config);
      # the router reads it once at start, so a change restarts it.
      template {
        data        = local.router_config
        destination = "local/router.hcl"
        change_mode = "restart"
      }

      # The PEM files come from the Nomad variable. The router re-reads them when they change
      # (at most once a second, keeping the last good pair if new ones are bad), so a rotation
      # restarts nothing: change_mode is noop.
      dynamic "template" {
        for_each = local.tls_files
        content {
          data        = "{{ with nomadVar \"${var.secrets_variable}\" }}{{ .${template.value.item} }}{{ end }}"
          destination = "secrets/tls/${template.value.file}"
          perms       = "0600"
          change_mode = "noop"
        }
      }

      dynamic "template" {
        for_each = var.peers_enabled ? ["peers_key"] : []
        content {
          data        = "{{ with nomadVar \"${var.secrets_variable}\" }}{{ .peers_key }}{{ end }}"
          destination = "secrets/peers-key"
          perms       = "0600"
          change_mode = "restart"
        }
      }

      dynamic "template" {
        for_each = var.response_id_key ? ["response_id_key"] : []
        content {
          data        = "{{ with nomadVar \"${var.secrets_variable}\" }}{{ .response_id_key }}{{ end }}"
          destination = "secrets/response-id-key"
          perms       = "0600"
          change_mode = "restart"
        }
      }

      # Hosted API keys reach the router as environment variables rendered from the Nomad variable
      # (never the job text, its arguments or the service meta). The router reads its environment
      # once, so a changed key restarts the task.
      dynamic "template" {
        for_each = length(local.hosted_key_names) > 0 ? ["hosted"] : []
        content {
          data        = join("", [for n in local.hosted_key_names : "{{ with nomadVar \"${var.secrets_variable}\" }}${n}={{ index . \"${n}\" | toJSON }}{{ end }}\n"])
          destination = "secrets/hosted.env"
          perms       = "0600"
          env         = true
          change_mode = "restart"
        }
      }

      # With federation the router reads other datacenters' Consul (?dc=), where its workload
      # identity's token is unknown: it is local to this datacenter, and Consul runs the query
      # there as the anonymous token (an empty answer, no error). So it uses a global token with
      # the oasis-router policy from the item consul_token (jobs/README.md, "Federation"); the
      # file wins over CONSUL_HTTP_TOKEN, and the router reads it once, so a new one restarts it.
      env {
        CONSUL_HTTP_TOKEN_FILE = var.federation_enabled ? "secrets/consul-token" : ""
      }

      dynamic "template" {
        for_each = var.federation_enabled ? ["consul_token"] : []
        content {
          data        = "{{ with nomadVar \"${var.secrets_variable}\" }}{{ .consul_token }}{{ end }}"
          destination = "secrets/consul-token"
          perms       = "0600"
          change_mode = "restart"
        }
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
