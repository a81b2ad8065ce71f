# Llama 3.1 8B Instruct (GGUF, Q4_K_M) on llama.cpp's llama-server, CPU only.
#
#   nomad job run recipes/llama3-8b/llama-cpp/cpu/job.nomad.hcl

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
  description = "Engine replicas."
  type        = number
  default     = 1
}

variable "model" {
  description = "GGUF file on the node."
  type        = string
  default     = "/opt/models/Meta-Llama-3.1-8B-Instruct-Q4_K_M.gguf"
}

variable "max_model_len" {
  description = "Context size (-c)."
  type        = number
  default     = 8192
}

variable "image" {
  description = "Engine image to run instead of the client's llama-server binary, e.g. \"ghcr.io/ggml-org/llama.cpp:server\" (llama.cpp's CPU server image; the flags were checked against llama.cpp commit 80fb11a (2026-09): pin that build by tag or @sha256 digest); empty runs the binary the client's plugin config names. Needs the plugin's container block (nomad-driver/README.md, Engines from images). With an image the model must be inside the allocation (an artifact into local/), not a host path."
  type        = string
  default     = ""
}

job "llama3-8b-llama-cpp-cpu" {
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
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-llama_cpp", "role-both"]
      meta {
        oasis_model        = "llama3-8b"
        oasis_engine       = "llama_cpp"
        oasis_role         = "both"
        oasis_kv_events    = ""
        oasis_metrics_path = "/metrics"
        oasis_block_size   = ""
        oasis_node         = "${node.unique.id}"
        # No KV events: the router models llama-server's cache (-c tokens)
        # from its own routing decisions.
        oasis_kv_capacity = "gpu=${var.max_model_len}"
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
          grace = "10m"
        }
      }
    }

    restart {
      attempts = 3
      interval = "30m"
      delay    = "30s"
      mode     = "fail"
    }

    task "llama-server" {
      driver = "llm"

      config {
        engine            = "llama_cpp"
        image             = var.image
        model             = var.model
        served_model_name = "llama3-8b"
        port              = "http"
        max_model_len     = var.max_model_len
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s) so the engine can free GPU memory.
      kill_signal  = "SIGTERM"
      kill_timeout = "120s"

      resources {
        cpu    = 8000
        memory = 12288
      }
    }
  }
}
