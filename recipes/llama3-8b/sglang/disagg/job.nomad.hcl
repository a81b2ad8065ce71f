# Llama 3.1 8B Instruct on SGLang, disaggregated prefill/decode over NIXL.
#
#   nomad job run recipes/llama3-8b/sglang/disagg/job.nomad.hcl

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

variable "prefill_count" {
  description = "Prefill engines."
  type        = number
  default     = 1
}

variable "decode_count" {
  description = "Decode engines."
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
  description = "Engine image to run instead of the client's sglang binary, e.g. \"lmsysorg/sglang:v0.5.5\" (the SGLang release whose flags this recipe renders); empty runs the binary the client's plugin config names. Needs the plugin's container block (nomad-driver/README.md, Engines from images)."
  type        = string
  default     = ""
}

# Autoscaling (README.md "Autoscaling"): the Nomad Autoscaler runs each group's `scaling` policy
# on the router's scaling signals in Prometheus (observability/README.md "Scaling signals"):
# prefill on the TTFT estimate and admission wait, decode on in-flight and KV usage.
variable "scaling_enabled" {
  description = "Whether the Nomad Autoscaler acts on the scaling policies (they are registered either way)."
  type        = bool
  default     = true
}

variable "prefill_scaling_max" {
  description = "Most prefill engines the autoscaler starts."
  type        = number
  default     = 4
}

variable "decode_scaling_max" {
  description = "Most decode engines the autoscaler starts."
  type        = number
  default     = 4
}

variable "ttft_slo_seconds" {
  description = "The model's TTFT SLO: prefill engines are added once the router's median estimated TTFT of the prefill engines passes half of it, or its admission wait a quarter of it."
  type        = number
  default     = 2
}

variable "target_in_flight" {
  description = "In-flight requests per engine each group is sized for: decode engines are added above it; an engine of either group is removed when the rest would stay under half of it for 5 minutes."
  type        = number
  default     = 48
}

variable "decode_kv_usage_high" {
  description = "Mean KV cache usage (0..1) of the decode engines above which decode engines are added."
  type        = number
  default     = 0.85
}

job "llama3-8b-sglang-disagg" {
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

  group "prefill" {
    count = var.prefill_count

    # Prefill engines scale on what they decide: the TTFT estimate and the admission wait
    # (README.md "Autoscaling"); in one at a time after 5 idle minutes, drained.
    scaling {
      enabled = var.scaling_enabled
      min     = 1
      max     = var.prefill_scaling_max

      policy {
        evaluation_interval  = "10s"
        cooldown             = "1m"
        cooldown_on_scale_up = "2m"

        # One group: a check voting "none" does not veto another's scale-in; any scale-out wins.
        check "ttft_slo" {
          source       = "prometheus"
          group        = "slo"
          query        = "max(oasis_router_scaling_estimated_ttft_p50_seconds{model=\"llama3-8b\",role=\"prefill\"})"
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

        # In-flight per engine were one engine fewer: under half the target for the whole window.
        check "idle" {
          source       = "prometheus"
          group        = "slo"
          query        = "sum(oasis_router_scaling_in_flight{model=\"llama3-8b\",role=\"prefill\"}) / clamp_min(max(oasis_router_scaling_workers{model=\"llama3-8b\",role=\"prefill\"}) - 1, 1)"
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
      port "http" {}
      port "kv_events" {}
      port "kv_events_replay" {}
      port "bootstrap" {}
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-sglang", "role-prefill"]
      meta {
        oasis_model            = "llama3-8b"
        oasis_engine           = "sglang"
        oasis_role             = "prefill"
        oasis_pd_protocol      = "sglang"
        oasis_bootstrap_port   = "${NOMAD_HOST_PORT_bootstrap}"
        oasis_kv_events        = "tcp://${NOMAD_ADDR_kv_events}"
        oasis_kv_events_replay = "tcp://${NOMAD_ADDR_kv_events_replay}"
        oasis_metrics_path     = "/metrics"
        oasis_block_size       = "16"
        oasis_node             = "${node.unique.id}"
      }
      check {
        name     = "health"
        type     = "http"
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

    task "sglang" {
      driver = "llm"

      config {
        engine                 = "sglang"
        image                  = var.image
        model                  = var.model
        served_model_name      = "llama3-8b"
        port                   = "http"
        kv_events_port         = "kv_events"
        kv_events_replay_port  = "kv_events_replay"
        max_model_len          = var.max_model_len
        gpu_memory_utilization = 0.85
        role                   = "prefill"
        kv_offload             = "nixl"
        bootstrap_port         = "bootstrap"
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s) so the engine can free GPU memory.
      kill_signal  = "SIGTERM"
      kill_timeout = "60s"

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

  group "decode" {
    count = var.decode_count

    # Decode engines scale on what they hold: in-flight per engine and KV usage (README.md
    # "Autoscaling"); in one at a time after 5 idle minutes, drained.
    scaling {
      enabled = var.scaling_enabled
      min     = 1
      max     = var.decode_scaling_max

      policy {
        evaluation_interval  = "10s"
        cooldown             = "1m"
        cooldown_on_scale_up = "2m"

        # One group: a check voting "none" does not veto another's scale-in; any scale-out wins.
        check "busy" {
          source       = "prometheus"
          group        = "slo"
          query        = "sum(oasis_router_scaling_in_flight{model=\"llama3-8b\",role=\"decode\"}) / clamp_min(max(oasis_router_scaling_workers{model=\"llama3-8b\",role=\"decode\"}), 1)"
          query_window = "30s"
          strategy "threshold" {
            lower_bound           = var.target_in_flight
            percentage            = 50
            within_bounds_trigger = 5
          }
        }

        check "kv_full" {
          source       = "prometheus"
          group        = "slo"
          query        = "max(oasis_router_scaling_kv_usage{model=\"llama3-8b\",role=\"decode\"})"
          query_window = "30s"
          strategy "threshold" {
            lower_bound           = var.decode_kv_usage_high
            percentage            = 50
            within_bounds_trigger = 5
          }
        }

        # In-flight per engine were one engine fewer: under half the target for the whole window.
        check "idle" {
          source       = "prometheus"
          group        = "slo"
          query        = "sum(oasis_router_scaling_in_flight{model=\"llama3-8b\",role=\"decode\"}) / clamp_min(max(oasis_router_scaling_workers{model=\"llama3-8b\",role=\"decode\"}) - 1, 1)"
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
      port "http" {}
      port "kv_events" {}
      port "kv_events_replay" {}
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-sglang", "role-decode"]
      meta {
        oasis_model            = "llama3-8b"
        oasis_engine           = "sglang"
        oasis_role             = "decode"
        oasis_pd_protocol      = "sglang"
        oasis_kv_events        = "tcp://${NOMAD_ADDR_kv_events}"
        oasis_kv_events_replay = "tcp://${NOMAD_ADDR_kv_events_replay}"
        oasis_metrics_path     = "/metrics"
        oasis_block_size       = "16"
        oasis_node             = "${node.unique.id}"
      }
      check {
        name     = "health"
        type     = "http"
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

    task "sglang" {
      driver = "llm"

      config {
        engine                 = "sglang"
        image                  = var.image
        model                  = var.model
        served_model_name      = "llama3-8b"
        port                   = "http"
        kv_events_port         = "kv_events"
        kv_events_replay_port  = "kv_events_replay"
        max_model_len          = var.max_model_len
        gpu_memory_utilization = 0.85
        role                   = "decode"
        kv_offload             = "nixl"
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
