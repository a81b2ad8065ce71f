# oasis-sim engine used by the tiny disaggregated recipe: a prefill and a decode instance of the
# same model that move the prompt's KV between them, in vLLM's or SGLang's protocol (README.md)
#
#   nomad job run recipes/tiny/sim/disagg/job.nomad.hcl
#   nomad job run -var protocol=sglang recipes/tiny/sim/disagg/job.nomad.hcl

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

variable "protocol" {
  description = "P/D protocol the sims speak: \"vllm\" (NIXL handshake through kv_transfer_params) or \"sglang\" (bootstrap rooms)."
  type        = string
  default     = "vllm"
  validation {
    condition     = contains(["vllm", "sglang"], var.protocol)
    error_message = "The protocol must be \"vllm\" or \"sglang\"."
  }
}

variable "speed" {
  description = "Simulated time scale: 1 = real time, 0 = no waiting."
  type        = string
  default     = "1"
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
  description = "The model's TTFT SLO, seconds: the oasis-sizing strategy sizes engines to meet it (a learned capacity derives from it; a profiled one is measured at it)."
  type        = number
  default     = 2
}

variable "prefill_engine_capacity" {
  description = "Requests/s one prefill engine serves within the TTFT SLO, profiled on your hardware and traffic (a load test at the SLO), or \"learned\": derived from the router's learned prefill rate of the prefill engines, the prompts' uncached tokens and the SLO (the oasis-sizing strategy, README.md \"Autoscaling\"). The default fits the demo's engines; profile yours."
  type        = string
  default     = "2"
}

variable "decode_engine_capacity" {
  description = "Requests/s one decode engine serves within the TTFT and TPOT SLOs, profiled on your hardware and traffic (a load test at the SLO). The default fits the demo's engines; profile yours."
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

job "tiny-sim-disagg" {
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

    # Prefill engines are sized for the arrival rate at what one prefill engine serves within the
    # TTFT SLO (profiled, or learned from the router's prefill rate; README.md "Autoscaling"); a
    # removed engine drains.
    scaling {
      enabled = var.scaling_enabled
      min     = 1
      max     = var.prefill_scaling_max

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
            capacity              = var.prefill_engine_capacity
            headroom              = var.scaling_headroom
            prefill_seconds_query = "(sum(rate(oasis_router_scaling_prefill_tokens_total{model=\"tiny-sim\",role=\"prefill\"}[${var.scaling_rate_window}])) / sum(rate(oasis_router_scaling_arrivals_total{model=\"tiny-sim\"}[${var.scaling_rate_window}]))) / avg(oasis_router_scaling_prefill_tokens_per_second{model=\"tiny-sim\",role=\"prefill\"})"
          }
        }
      }
    }

    # The service leaves Consul (and the router) this long before the engine is stopped;
    # the llm driver then waits for in-flight requests, up to kill_timeout (README: Draining).
    shutdown_delay = "2s"

    network {
      port "http" {}
      port "kv_events" {}
      port "kv_events_replay" {}
      # The KV side channel: vLLM's NIXL side-channel port or SGLang's bootstrap port.
      dynamic "port" {
        for_each = [var.protocol == "sglang" ? "bootstrap" : "nixl"]
        labels   = [port.value]
        content {}
      }
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-sim", "role-prefill"]
      # One meta block per protocol: SGLang-style prefill engines also advertise their
      # bootstrap port (HCL cannot leave an attribute out of a single block).
      dynamic "meta" {
        for_each = var.protocol == "vllm" ? [1] : []
        content {
          oasis_model            = "tiny-sim"
          oasis_engine           = "sim"
          oasis_role             = "prefill"
          oasis_pd_protocol      = var.protocol
          oasis_kv_events        = "tcp://${NOMAD_ADDR_kv_events}"
          oasis_kv_events_replay = "tcp://${NOMAD_ADDR_kv_events_replay}"
          oasis_metrics_path     = "/metrics"
          oasis_block_size       = "16"
          oasis_node             = "${node.unique.id}"
        }
      }
      dynamic "meta" {
        for_each = var.protocol == "sglang" ? [1] : []
        content {
          oasis_model            = "tiny-sim"
          oasis_engine           = "sim"
          oasis_role             = "prefill"
          oasis_pd_protocol      = var.protocol
          oasis_kv_events        = "tcp://${NOMAD_ADDR_kv_events}"
          oasis_kv_events_replay = "tcp://${NOMAD_ADDR_kv_events_replay}"
          oasis_metrics_path     = "/metrics"
          oasis_block_size       = "16"
          oasis_node             = "${node.unique.id}"
          oasis_bootstrap_port   = "${NOMAD_HOST_PORT_bootstrap}"
        }
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
        engine                 = "sim"
        model                  = "tiny-sim"
        port                   = "http"
        kv_events_port         = "kv_events"
        kv_events_replay_port  = "kv_events_replay"
        role                   = "prefill"
        kv_offload             = "nixl"
        nixl_side_channel_port = var.protocol == "vllm" ? "nixl" : null
        bootstrap_port         = var.protocol == "sglang" ? "bootstrap" : null
        extra_args             = ["--speed", var.speed]
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s) so the engine can free GPU memory.
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }

  group "decode" {
    count = var.decode_count

    # Decode engines are sized for the same arrival rate at what one decode engine serves (its own
    # profiled capacity; README.md "Autoscaling"); a removed engine drains.
    scaling {
      enabled = var.scaling_enabled
      min     = 1
      max     = var.decode_scaling_max

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
            capacity              = var.decode_engine_capacity
            headroom              = var.scaling_headroom
          }
        }
      }
    }

    # The service leaves Consul (and the router) this long before the engine is stopped;
    # the llm driver then waits for in-flight requests, up to kill_timeout (README: Draining).
    shutdown_delay = "2s"

    network {
      port "http" {}
      port "kv_events" {}
      port "kv_events_replay" {}
      # The KV side channel: vLLM's NIXL side-channel port or SGLang's bootstrap port.
      dynamic "port" {
        for_each = [var.protocol == "sglang" ? "bootstrap" : "nixl"]
        labels   = [port.value]
        content {}
      }
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-sim", "role-decode"]
      meta {
        oasis_model            = "tiny-sim"
        oasis_engine           = "sim"
        oasis_role             = "decode"
        oasis_pd_protocol      = var.protocol
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
        engine                 = "sim"
        model                  = "tiny-sim"
        port                   = "http"
        kv_events_port         = "kv_events"
        kv_events_replay_port  = "kv_events_replay"
        role                   = "decode"
        kv_offload             = "nixl"
        nixl_side_channel_port = var.protocol == "vllm" ? "nixl" : null
        bootstrap_port         = var.protocol == "sglang" ? "bootstrap" : null
        extra_args             = ["--speed", var.speed]
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s) so the engine can free GPU memory.
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 200
        memory = 128
      }
    }
  }
}
