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
