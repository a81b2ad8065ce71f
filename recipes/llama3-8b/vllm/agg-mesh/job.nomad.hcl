# Llama 3.1 8B on vLLM in the Consul service mesh: the engine runs in the allocation's own
# network namespace (bridge networking), its API bound to 127.0.0.1 there, behind an Envoy
# Connect sidecar that admits what the intentions allow (jobs/mesh/oasis-engine.hcl: the
# router). The router dials each engine's sidecar itself (jobs/router.nomad.hcl with
# mesh_enabled), keeping its per-instance KV-aware choice. KV events stay on mapped ports.
#
#   nomad job run recipes/llama3-8b/vllm/agg-mesh/job.nomad.hcl

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
  description = "Engine replicas (one GPU each)."
  type        = number
  default     = 1
}

variable "model" {
  description = "Model the engine loads (Hugging Face id or local path)."
  type        = string
  default     = "meta-llama/Llama-3.1-8B-Instruct"
}

variable "max_model_len" {
  description = "Longest context served."
  type        = number
  default     = 8192
}

variable "image" {
  description = "Engine image to run instead of the client's vllm binary, e.g. \"vllm/vllm-openai:v0.11.2\" (the vLLM release whose flags this recipe renders); empty runs the binary the client's plugin config names. Needs the plugin's container block (nomad-driver/README.md, Engines from images)."
  type        = string
  default     = ""
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
  description = "The model's TTFT SLO: engines are added once the router's median estimated TTFT (over the engines) passes half of it, or its admission wait a quarter of it."
  type        = number
  default     = 2
}

variable "target_in_flight" {
  description = "In-flight requests per engine the fleet is sized for: engines are added above it, one is removed when the rest would stay under half of it for 5 minutes."
  type        = number
  default     = 48
}

job "llama3-8b-vllm-agg-mesh" {
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

    # SLO autoscaling (README.md "Autoscaling"): out fast before the TTFT SLO is missed, in one
    # engine at a time after 5 idle minutes; a removed engine drains (shutdown_delay, kill_timeout).
    scaling {
      enabled = var.scaling_enabled
      min     = var.scaling_min
      max     = var.scaling_max

      policy {
        evaluation_interval  = "10s"
        cooldown             = "1m"
        cooldown_on_scale_up = "2m"

        # One group: a check voting "none" does not veto another's scale-in; any scale-out wins.
        check "ttft_slo" {
          source       = "prometheus"
          group        = "slo"
          query        = "max(oasis_router_scaling_estimated_ttft_p50_seconds{model=\"llama3-8b\",role=\"both\"})"
          query_window = "30s"
          strategy "threshold" {
            lower_bound           = var.ttft_slo_seconds * 0.5
            percentage            = 50
            within_bounds_trigger = 5
          }
        }

        check "queue_wait" {
          source       = "prometheus"
          group        = "slo"
          query        = "max(oasis_router_scaling_queue_wait_seconds{model=\"llama3-8b\"})"
          query_window = "30s"
          strategy "threshold" {
            lower_bound           = var.ttft_slo_seconds * 0.25
            percentage            = 50
            within_bounds_trigger = 5
          }
        }

        check "busy" {
          source       = "prometheus"
          group        = "slo"
          query        = "sum(oasis_router_scaling_in_flight{model=\"llama3-8b\",role=\"both\"}) / clamp_min(max(oasis_router_scaling_workers{model=\"llama3-8b\",role=\"both\"}), 1)"
          query_window = "30s"
          strategy "threshold" {
            lower_bound           = var.target_in_flight
            percentage            = 50
            within_bounds_trigger = 5
          }
        }

        # In-flight per engine were one engine fewer: under half the target for the whole window.
        check "idle" {
          source       = "prometheus"
          group        = "slo"
          query        = "sum(oasis_router_scaling_in_flight{model=\"llama3-8b\",role=\"both\"}) / clamp_min(max(oasis_router_scaling_workers{model=\"llama3-8b\",role=\"both\"}) - 1, 1)"
          query_window = "300s"
          strategy "threshold" {
            upper_bound           = var.target_in_flight * 0.5
            delta                 = -1
            within_bounds_trigger = 300
          }
        }
      }
    }

    # The service leaves Consul (and the router) this long before the engine is stopped;
    # the llm driver then waits for in-flight requests, up to kill_timeout (README: Draining).
    shutdown_delay = "5s"

    network {
      mode = "bridge"
      port "http" {
        to = 8000
      }
      # Same number inside the namespace and on the host: the meta below names the host side.
      port "kv_events" {}
      port "kv_events_replay" {}
      port "health" {
        to = -1
      }
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-vllm", "role-both", "mesh"]
      meta {
        oasis_model            = "llama3-8b"
        oasis_engine           = "vllm"
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
            local_service_port    = 8000
            # Envoy serves /health on a path of its own for Consul's check (the API answers on
            # the namespace's loopback only).
            expose {
              path {
                path            = "/health"
                protocol        = "http"
                local_path_port = 8000
                listener_port   = "health"
              }
            }
          }
        }
      }

      check {
        name     = "health"
        type     = "http"
        port     = "health"
        path     = "/health"
        interval = "10s"
        timeout  = "3s"
        # Model loads take minutes: failing checks restart the task only after the grace.
        check_restart {
          limit = 3
          grace = "15m"
        }
      }
    }

    restart {
      attempts = 3
      interval = "30m"
      delay    = "30s"
      mode     = "fail"
    }

    task "vllm" {
      driver = "llm"

      config {
        engine                 = "vllm"
        image                  = var.image
        model                  = var.model
        served_model_name      = "llama3-8b"
        port                   = "http"
        bind_address           = "127.0.0.1"
        kv_events_port         = "kv_events"
        kv_events_replay_port  = "kv_events_replay"
        max_model_len          = var.max_model_len
        gpu_memory_utilization = 0.90
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s) so the engine can free GPU memory.
      kill_signal  = "SIGTERM"
      kill_timeout = "120s"

      resources {
        cpu    = 4000
        memory = 16384

        device "nvidia/gpu" {
          count = 1
          constraint {
            attribute = "${device.attr.memory}"
            operator  = ">="
            value     = "24 GiB"
          }
        }
      }
    }
  }
}
