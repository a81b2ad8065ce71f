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
