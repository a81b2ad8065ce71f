# oasis-sim engines in the Consul service mesh: each engine runs in the allocation's own network
# namespace (bridge networking), its API bound to 127.0.0.1 there, reachable only through its
# Connect sidecar, which admits callers the intentions allow (jobs/mesh/oasis-engine.hcl: the
# router). The router dials each engine's sidecar itself (jobs/router.nomad.hcl with
# mesh_enabled), so its per-instance KV-aware choice survives the mesh. KV events stay on mapped
# ports, outside the mesh, as without it.
#
#   nomad job run recipes/tiny/sim/agg-mesh/job.nomad.hcl                       # Envoy sidecars
#   nomad job run -var sidecar=consul -var consul_http_addr=unix:///run/consul/http.sock \
#     recipes/tiny/sim/agg-mesh/job.nomad.hcl                                  # no Envoy: Consul's proxy

variable "region" {
  description = "Nomad region the job runs in (jobs/README.md runs it in every region)."
  type        = string
  default     = "global"
}

variable "datacenters" {
  description = "Datacenters to run in."
  type        = list(string)
  default     = ["*"]
}

variable "count" {
  description = "Simulated engines."
  type        = number
  default     = 3
}

variable "speed" {
  description = "Simulated time scale: 1 = real time, 0 = no waiting."
  type        = string
  default     = "1"
}

variable "sidecar" {
  description = "The Connect sidecar: envoy (Nomad's default sidecar task) or consul (Consul's built-in L4 proxy in a raw_exec task, for clients without Envoy)."
  type        = string
  default     = "envoy"
  validation {
    condition     = contains(["envoy", "consul"], var.sidecar)
    error_message = "The sidecar must be envoy or consul."
  }
}

variable "consul_bin" {
  description = "With sidecar = consul: the consul binary on the client."
  type        = string
  default     = "consul"
}

variable "consul_http_addr" {
  description = "With sidecar = consul: the Consul agent's HTTP API as the allocation's namespace reaches it, e.g. unix:///run/consul/http.sock (the host's loopback is not the namespace's; Consul serves a unix socket with addresses { http = \"127.0.0.1 unix:///run/consul/http.sock\" })."
  type        = string
  default     = ""
}

locals {
  engine_port = 8000
}

# Autoscaling (README.md "Autoscaling"): the Nomad Autoscaler runs the engine group's `scaling`
# policy on the router's scaling signals in Prometheus (observability/README.md "Scaling signals").
variable "scaling_enabled" {
  description = "Whether the Nomad Autoscaler acts on the scaling policy (a policy is registered either way)."
  type        = bool
  default     = true
}

variable "scaling_min" {
  description = "Fewest engines the autoscaler leaves running."
  type        = number
  default     = 1
}

variable "scaling_max" {
  description = "Most engines the autoscaler starts (GPUs: count × the engine's GPUs)."
  type        = number
  default     = 8
}

variable "ttft_slo_seconds" {
  description = "The model's TTFT SLO, seconds: the oasis-sizing strategy sizes engines to meet it (a learned capacity derives from it; a profiled one is measured at it)."
  type        = number
  default     = 2
}

variable "engine_capacity" {
  description = "Requests/s one engine serves within the TTFT SLO, profiled on your hardware and traffic (a load test at the SLO), or \"learned\": derived from the router's learned prefill rate, the prompts' uncached tokens and the SLO (the oasis-sizing strategy, README.md \"Autoscaling\"). The default fits the demo engines at max_num_seqs 2 and requests of ~1,000 prompt tokens and 100 out."
  type        = string
  default     = "2"
}

variable "scaling_headroom" {
  description = "Share of extra engines over what the measured arrival rate needs: room for the rise while an engine starts (the oasis-sizing strategy's headroom)."
  type        = number
  default     = 0.08
}

variable "scaling_rate_window" {
  description = "Window of the arrival rate the policy sizes on (PromQL duration)."
  type        = string
  default     = "1m"
}

job "tiny-sim-agg-mesh" {
  region      = var.region
  datacenters = var.datacenters
  type        = "service"

  update {
    max_parallel      = 1
    health_check      = "checks"
    min_healthy_time  = "30s"
    healthy_deadline  = "30m"
    progress_deadline = "40m"
    auto_revert       = true
  }

  group "engine" {
    count = var.count

    # SLO autoscaling (README.md "Autoscaling"): the Oasis strategy plugin (oasis-sizing) runs
    # ceil(arrival rate x (1 + headroom) / per-engine capacity) engines; a removed engine drains
    # (shutdown_delay, kill_timeout).
    scaling {
      enabled = var.scaling_enabled
      min     = var.scaling_min
      max     = var.scaling_max

      policy {
        evaluation_interval  = "10s"
        cooldown             = "1m"
        cooldown_on_scale_up = "30s"

        check "arrival_rate" {
          source       = "prometheus"
          query        = "sum(rate(oasis_router_scaling_arrivals_total{model=\"tiny-sim\"}[${var.scaling_rate_window}])) or vector(0)"
          query_window = "30s"
          strategy "oasis-sizing" {
            ttft_slo_seconds      = var.ttft_slo_seconds
            capacity              = var.engine_capacity
            headroom              = var.scaling_headroom
            prefill_seconds_query = "(sum(rate(oasis_router_scaling_prefill_tokens_total{model=\"tiny-sim\",role=\"both\"}[${var.scaling_rate_window}])) / sum(rate(oasis_router_scaling_arrivals_total{model=\"tiny-sim\"}[${var.scaling_rate_window}]))) / avg(oasis_router_scaling_prefill_tokens_per_second{model=\"tiny-sim\",role=\"both\"})"
          }
        }
      }
    }

    # The service leaves Consul (and the router) this long before the engine is stopped;
    # the llm driver then waits for in-flight requests, up to kill_timeout (README: Draining).
    shutdown_delay = "2s"

    network {
      mode = "bridge"
      port "http" {
        to = local.engine_port
      }
      # Same number inside the namespace and on the host: the meta below names the host side.
      port "kv_events" {}
      port "kv_events_replay" {}
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-sim", "role-both", "mesh"]
      meta {
        oasis_model            = "tiny-sim"
        oasis_engine           = "sim"
        oasis_role             = "both"
        oasis_kv_events        = "tcp://${NOMAD_ADDR_kv_events}"
        oasis_kv_events_replay = "tcp://${NOMAD_ADDR_kv_events_replay}"
        oasis_metrics_path     = "/metrics"
        oasis_block_size       = "16"
        oasis_node             = "${node.unique.id}"
      }

      connect {
        sidecar_service {
          proxy {
            local_service_address = "127.0.0.1"
            local_service_port    = local.engine_port
          }
        }

        # Consul's built-in proxy in flag mode: with -sidecar-for it would bind the registered
        # host-side address, which is not in the namespace. The token is the service identity
        # Nomad derives for oasis-engine.
        dynamic "sidecar_task" {
          for_each = var.sidecar == "consul" ? ["consul"] : []
          content {
            driver = "raw_exec"
            config {
              command = var.consul_bin
              args = [
                "connect", "proxy",
                "-service", "oasis-engine",
                "-service-addr", "127.0.0.1:${local.engine_port}",
                "-listen", "0.0.0.0:${NOMAD_PORT_connect_proxy_oasis_engine}",
                "-http-addr", var.consul_http_addr,
                "-token-file", "${NOMAD_SECRETS_DIR}/si_token",
              ]
            }
            resources {
              cpu    = 100
              memory = 128
            }
          }
        }
      }

      # The API answers on the namespace's loopback only, which Consul's agent cannot reach: the
      # check runs inside the engine task.
      check {
        name     = "health"
        type     = "script"
        task     = "sim"
        command  = "/usr/bin/curl"
        args     = ["-fsS", "-o", "/dev/null", "http://127.0.0.1:${local.engine_port}/health"]
        interval = "10s"
        timeout  = "3s"
        check_restart {
          limit = 3
          grace = "30s"
        }
      }
    }

    restart {
      attempts = 3
      interval = "30m"
      delay    = "30s"
      mode     = "fail"
    }

    task "sim" {
      driver = "llm"

      config {
        engine                = "sim"
        model                 = "tiny-sim"
        port                  = "http"
        bind_address          = "127.0.0.1"
        kv_events_port        = "kv_events"
        kv_events_replay_port = "kv_events_replay"
        extra_args            = ["--speed", var.speed]
      }

      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
