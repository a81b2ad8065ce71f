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
  description = "The model's TTFT SLO: engines are added once the router's median estimated TTFT (over the engines) passes half of it, or its admission wait a quarter of it."
  type        = number
  default     = 1
}

variable "target_in_flight" {
  description = "In-flight requests per engine the fleet is sized for: engines are added above it, one is removed when the rest would stay under half of it."
  type        = number
  default     = 16
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

variable "scale_in_idle_seconds" {
  description = "An engine is removed only when the fleet stayed idle enough (see target_in_flight) for this many seconds in a row."
  type        = number
  default     = 300
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

    # SLO autoscaling (README.md "Autoscaling"): out fast before the TTFT SLO is missed, in one
    # engine at a time after a long idle window; scale-in drains like any stop (below).
    scaling {
      enabled = var.scaling_enabled
      min     = var.scaling_min
      max     = var.scaling_max

      policy {
        evaluation_interval  = var.scaling_evaluation_interval
        cooldown             = var.scale_in_cooldown
        cooldown_on_scale_up = var.scale_out_cooldown

        # One group: a check voting "none" does not veto another's scale-in; any scale-out wins.
        check "ttft_slo" {
          source       = "prometheus"
          group        = "slo"
          query        = "max(oasis_router_scaling_estimated_ttft_p50_seconds{model=\"tiny-sim\",role=\"both\"})"
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
          query        = "max(oasis_router_scaling_queue_wait_seconds{model=\"tiny-sim\"})"
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
          query        = "sum(oasis_router_scaling_in_flight{model=\"tiny-sim\",role=\"both\"}) / clamp_min(max(oasis_router_scaling_workers{model=\"tiny-sim\",role=\"both\"}), 1)"
          query_window = "30s"
          strategy "threshold" {
            lower_bound           = var.target_in_flight
            percentage            = 50
            within_bounds_trigger = 5
          }
        }

        # In-flight per engine were one engine fewer: below half the target for the whole window.
        check "idle" {
          source       = "prometheus"
          group        = "slo"
          query        = "sum(oasis_router_scaling_in_flight{model=\"tiny-sim\",role=\"both\"}) / clamp_min(max(oasis_router_scaling_workers{model=\"tiny-sim\",role=\"both\"}) - 1, 1)"
          query_window = "${var.scale_in_idle_seconds}s"
          strategy "threshold" {
            upper_bound           = var.target_in_flight * 0.5
            delta                 = -1
            within_bounds_trigger = var.scale_in_idle_seconds
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
