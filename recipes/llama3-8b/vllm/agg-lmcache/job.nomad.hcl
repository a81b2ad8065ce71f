# Llama 3.1 8B Instruct on vLLM: vLLM with LMCache, a CPU tier in front of the cluster's LMCache
# server, both from the KV offload tier the platform team declared (kind lmcache-server).
#
#   nomad job run recipes/llama3-8b/vllm/agg-lmcache/job.nomad.hcl

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

variable "kv_offload_tier" {
  description = "The KV offload tier (kind lmcache-server) declared in Nomad variable oasis/tiers/<name>: the driver renders LMCache's CPU tier size (size_gb) and remote_url lm://<address> from it (nomad-driver/README.md, KV offload tiers)."
  type        = string
  default     = "lmcache-server"
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
  description = "The model's TTFT SLO, seconds: the oasis-sizing strategy sizes engines to meet it (a learned capacity derives from it; a profiled one is measured at it)."
  type        = number
  default     = 2
}

variable "engine_capacity" {
  description = "Requests/s one engine serves within the TTFT SLO, profiled on your hardware and traffic (a load test at the SLO), or \"learned\": derived from the router's learned prefill rate, the prompts' uncached tokens and the SLO (the oasis-sizing strategy, README.md \"Autoscaling\"). The default is what one H100 engine served at the 2 s SLO in the cluster simulator's Llama-3-8B profile on the Mooncake conversation trace (BENCHMARKS.md, Autoscaling on a diurnal trace): profile yours."
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

job "llama3-8b-vllm-agg-lmcache" {
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
          query        = "sum(rate(oasis_router_scaling_arrivals_total{model=\"llama3-8b\"}[${var.scaling_rate_window}])) or vector(0)"
          query_window = "30s"
          strategy "oasis-sizing" {
            ttft_slo_seconds      = var.ttft_slo_seconds
            capacity              = var.engine_capacity
            headroom              = var.scaling_headroom
            prefill_seconds_query = "(sum(rate(oasis_router_scaling_prefill_tokens_total{model=\"llama3-8b\",role=\"both\"}[${var.scaling_rate_window}])) / sum(rate(oasis_router_scaling_arrivals_total{model=\"llama3-8b\"}[${var.scaling_rate_window}]))) / avg(oasis_router_scaling_prefill_tokens_per_second{model=\"llama3-8b\",role=\"both\"})"
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
      tags     = ["oasis", "engine-vllm", "role-both"]
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

    task "vllm" {
      driver = "llm"

      # The driver reads the tier with this identity at start.
      identity {
        file = true
      }

      config {
        engine                 = "vllm"
        image                  = var.image
        model                  = var.model
        served_model_name      = "llama3-8b"
        port                   = "http"
        kv_events_port         = "kv_events"
        kv_events_replay_port  = "kv_events_replay"
        max_model_len          = var.max_model_len
        gpu_memory_utilization = 0.90
        kv_offload_tier        = var.kv_offload_tier
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s) so the engine can free GPU memory.
      kill_signal  = "SIGTERM"
      kill_timeout = "120s"

      resources {
        cpu    = 4000
        memory = 49152

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
