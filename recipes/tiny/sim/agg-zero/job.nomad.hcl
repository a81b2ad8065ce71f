# oasis-sim engines that scale to zero: the group runs no engine until a request for
# tiny-sim-zero arrives; the router holds it (its policy's scale_to_zero) while the Nomad
# Autoscaler starts one, and the engine is removed again after an idle period (README.md).
#
#   nomad job run recipes/tiny/sim/agg-zero/job.nomad.hcl

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
  description = "Engines at submission: 0, the autoscaler starts one when the router holds a request (re-running the job sets the count back to this)."
  type        = number
  default     = 0
}

# Scale to zero (README.md): the Nomad Autoscaler starts the first engine on the router's held
# requests and removes the last after an idle period (observability/README.md "Scaling signals").
variable "scaling_enabled" {
  description = "Whether the Nomad Autoscaler acts on the scaling policy (a policy is registered either way)."
  type        = bool
  default     = true
}

variable "scaling_max" {
  description = "Most engines: the wake check starts one at a time while requests are held."
  type        = number
  default     = 1
}

variable "scaling_evaluation_interval" {
  description = "How often the autoscaler evaluates the policy: part of every cold start."
  type        = string
  default     = "5s"
}

variable "wake_cooldown" {
  description = "Pause after starting an engine (covers its start and health check), so a request still held meanwhile does not start another."
  type        = string
  default     = "30s"
}

variable "scale_in_cooldown" {
  description = "Pause after removing an engine: short, as a request arriving then waits it out on top of the cold start."
  type        = string
  default     = "5s"
}

variable "idle_seconds" {
  description = "The engine is removed once no request for the model has ended at any router for this many seconds."
  type        = number
  default     = 300
}

variable "check_interval" {
  description = "Consul health check interval of an engine: the router sees a started engine only once it passes."
  type        = string
  default     = "2s"
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

job "tiny-sim-zero" {
  region      = var.region
  datacenters = var.datacenters
  node_pool   = var.node_pool
  type        = "service"

  update {
    max_parallel      = 1
    health_check      = "checks"
    min_healthy_time  = "10s"
    healthy_deadline  = "30m"
    progress_deadline = "40m"
    auto_revert       = true
  }

  group "engine" {
    count = var.count

    # Scale to zero (README.md): one check group, so a check that sees nothing to do does not
    # veto the other; wake (a scale-out) wins over idle.
    scaling {
      enabled = var.scaling_enabled
      min     = 0
      max     = var.scaling_max

      policy {
        evaluation_interval  = var.scaling_evaluation_interval
        cooldown             = var.scale_in_cooldown
        cooldown_on_scale_up = var.wake_cooldown

        # Requests held for the model at any router (no engine serves it): start one.
        check "wake" {
          source       = "prometheus"
          group        = "zero"
          query        = "sum(oasis_router_scaling_held_requests{model=\"tiny-sim-zero\"})"
          query_window = "10s"
          strategy "threshold" {
            lower_bound           = 1
            delta                 = 1
            within_bounds_trigger = 1
          }
        }

        # No request for the model ended at any router in the last idle_seconds: back to zero.
        check "idle" {
          source       = "prometheus"
          group        = "zero"
          query        = "sum(increase(oasis_router_request_duration_seconds_count{model=\"tiny-sim-zero\"}[${var.idle_seconds}s])) or vector(0)"
          query_window = "10s"
          strategy "threshold" {
            upper_bound           = 0.5
            value                 = 0
            within_bounds_trigger = 5
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
        oasis_model            = "tiny-sim-zero"
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
        interval = var.check_interval
        timeout  = "1s"
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
        model                 = "tiny-sim-zero"
        port                  = "http"
        kv_events_port        = "kv_events"
        kv_events_replay_port = "kv_events_replay"
        extra_args            = ["--speed", var.speed]
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
