# Llama 3.1 8B Instruct on SGLang with HiCache over a shared filesystem: GPU radix cache, a host-memory
# tier and, behind it, HiCache's file storage backend in a directory every node mounts (NFS, Lustre,
# a cloud file share), so a prefix one replica computed is read back by the others. The directory and
# sizes come from the KV offload tier the platform team declared (kind shared-fs).
#
#   nomad job run recipes/llama3-8b/sglang/agg-shared-fs/job.nomad.hcl

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
  description = "The KV offload tier (kind shared-fs) declared in Nomad variable oasis/tiers/<name>: the driver renders --hicache-size (size_gb), --hicache-storage-backend file and SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR (path) from it."
  type        = string
  default     = "shared-fs"
}

variable "image" {
  description = "Engine image to run instead of the client's sglang binary, e.g. \"lmsysorg/sglang:v0.5.5\" (the SGLang release whose flags this recipe renders); empty runs the binary the client's plugin config names. Needs the plugin's container block (nomad-driver/README.md, Engines from images)."
  type        = string
  default     = ""
}

job "llama3-8b-sglang-agg-shared-fs" {
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
      tags     = ["oasis", "engine-sglang", "role-both"]
      meta {
        oasis_model            = "llama3-8b"
        oasis_engine           = "sglang"
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

    task "sglang" {
      driver = "llm"

      # The driver reads the tier with this identity at start.
      identity {
        file = true
      }

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
        kv_offload_tier        = var.kv_offload_tier
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s) so the engine can free GPU memory.
      kill_signal  = "SIGTERM"
      kill_timeout = "120s"

      resources {
        cpu    = 4000
        memory = 81920

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
