# oasis-sim engines (vLLM-compatible simulator): runs anywhere, no GPU, no weights.
#
#   nomad job run recipes/tiny/sim/agg/job.nomad.hcl

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

variable "node_pool" {
  description = "Nomad node pool the engines run in (GPU nodes from terraform/modules/nomad-gpu-client join pool \"gpu\" by default)."
  type        = string
  default     = "default"
}

variable "count" {
  description = "Simulated engines."
  type        = number
  default     = 3
}

variable "max_num_seqs" {
  description = "Running batch bound per engine (vLLM --max-num-seqs); 0 keeps oasis-sim's default (1024). A small one makes requests queue in the engine, and TTFT grow, at a load the demo can reach."
  type        = number
  default     = 0
}

# Autoscaling (README.md "Autoscaling"): the Nomad Autoscaler runs the group's `scaling` policy
# on the router's scaling signals in Prometheus (observability/README.md "Scaling signals").
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
  description = "Most engines the autoscaler starts."
  type        = number
  default     = 8
}

variable "ttft_slo_seconds" {
  description = "The model's TTFT SLO, seconds: the oasis-sizing strategy sizes engines to meet it (a learned capacity derives from it; a profiled one is measured at it)."
  type        = number
  default     = 1
}

variable "engine_capacity" {
  description = "Requests/s one engine serves within the TTFT SLO, profiled on your hardware and traffic (a load test at the SLO), or \"learned\": derived from the router's learned prefill rate, the prompts' uncached tokens and the SLO (the oasis-sizing strategy, README.md \"Autoscaling\"). The default fits the demo engines at max_num_seqs 2 and the e2e test's requests (~1,000 prompt tokens, 100 out)."
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

variable "scaling_evaluation_interval" {
  description = "How often the autoscaler evaluates the policy."
  type        = string
  default     = "10s"
}

variable "scale_out_cooldown" {
  description = "Pause after adding engines (covers an engine's start and its first scrapes)."
  type        = string
  default     = "30s"
}

variable "scale_in_cooldown" {
  description = "Pause after removing an engine."
  type        = string
  default     = "1m"
}

variable "speed" {
  description = "Simulated time scale: 1 = real time, 0 = no waiting."
  type        = string
  default     = "1"
}

variable "artifact_url" {
  description = "URL of a release tarball (make dist: oasis_<version>_linux_<arch>.tar.gz) Nomad fetches into the task's local/oasis; the engine runs its oasis-sim. Empty: the llm driver finds oasis-sim as configured on the node (binaries map or PATH)."
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

locals {
  # The driver resolves the binary in its own process, so the path is the task directory's
  # absolute one (the llm driver does not isolate the filesystem). go-getter skips an empty
  # checksum, so one is mandatory.
  sim_binary = var.artifact_url == "" ? null : (
    var.artifact_checksum != "" ? "${NOMAD_TASK_DIR}/oasis/oasis-sim" : file("artifact_checksum is required with artifact_url")
  )
}

job "tiny-sim-agg" {
  region      = var.region
  datacenters = var.datacenters
  node_pool   = var.node_pool
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
        evaluation_interval  = var.scaling_evaluation_interval
        cooldown             = var.scale_in_cooldown
        cooldown_on_scale_up = var.scale_out_cooldown

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
      port "http" {}
      port "kv_events" {}
      port "kv_events_replay" {}
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-sim", "role-both"]
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

      config {
        engine                = "sim"
        binary                = local.sim_binary
        model                 = "tiny-sim"
        port                  = "http"
        kv_events_port        = "kv_events"
        kv_events_replay_port = "kv_events_replay"
        extra_args            = concat(["--speed", var.speed], var.max_num_seqs > 0 ? ["--max-num-seqs", format("%d", var.max_num_seqs)] : [])
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
