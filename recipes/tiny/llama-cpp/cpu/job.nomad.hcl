# Real llama.cpp engines on CPU: llama-server (scripts/hashistack.sh llama-server builds it) serving
# the tiny random-weight Llama model oasis-tinymodel writes. Its words are noise; tokenization, the
# chat template, slots, the KV cache, metrics and errors are llama-server's own.
#
#   bin/oasis-tinymodel -o /opt/models/oasis-tiny.gguf
#   nomad job run recipes/tiny/llama-cpp/cpu/job.nomad.hcl

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
  default     = 3
}

variable "model" {
  description = "The GGUF file on the node (bin/oasis-tinymodel -o PATH writes it)."
  type        = string
  default     = "/opt/models/oasis-tiny.gguf"
}

variable "parallel" {
  description = "llama-server's slots (-np): requests each engine serves at once."
  type        = number
  default     = 2
}

job "tiny-llama-cpp-cpu" {
  region      = var.region
  datacenters = var.datacenters
  type        = "service"

  update {
    max_parallel      = 1
    health_check      = "checks"
    min_healthy_time  = "5s"
    healthy_deadline  = "5m"
    progress_deadline = "10m"
    auto_revert       = true
  }

  group "engine" {
    count = var.count

    # The service leaves Consul (and the router) this long before the engine is stopped;
    # the llm driver then waits for in-flight requests, up to kill_timeout (README: Draining).
    shutdown_delay = "2s"

    network {
      port "http" {}
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-llama_cpp", "role-both"]
      meta {
        oasis_model        = "tiny-llama"
        oasis_engine       = "llama_cpp"
        oasis_role         = "both"
        oasis_kv_events    = ""
        oasis_metrics_path = "/metrics"
        oasis_block_size   = ""
        oasis_node         = "${node.unique.id}"
        # No KV events: the router models llama-server's cache (-c tokens) from its own
        # routing decisions.
        oasis_kv_capacity = "gpu=4096"
      }
      check {
        name     = "health"
        type     = "http"
        path     = "/health"
        interval = "5s"
        timeout  = "2s"
      }
    }

    restart {
      attempts = 3
      interval = "30m"
      delay    = "5s"
      mode     = "fail"
    }

    task "llama-server" {
      driver = "llm"

      config {
        engine            = "llama_cpp"
        model             = var.model
        served_model_name = "tiny-llama"
        port              = "http"
        max_model_len     = 4096
        # One thread each: several engines share a small machine.
        extra_args = ["-np", "${var.parallel}", "-t", "1", "-tb", "1"]
      }

      # The driver drains in-flight requests (up to kill_timeout), then SIGTERM; SIGKILL after
      # what is left of kill_timeout (at least 5 s).
      kill_signal  = "SIGTERM"
      kill_timeout = "30s"

      resources {
        cpu    = 500
        memory = 256
      }
    }
  }
}
