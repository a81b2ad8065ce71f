# A hosted OpenAI-compatible endpoint as a fallback pool: no process runs; the llm driver keeps
# the task running while the endpoint answers, and the service registration tells the router to
# send this model's requests there (oasis_upstream) with the API key from the router's
# environment variable named in oasis_upstream_key_env (the key never enters Consul).
#
#   nomad job run -var 'endpoint=https://api.example.com/v1' -var 'model=gpt-4o-mini' \
#     recipes/hosted/openai-compat/fallback/job.nomad.hcl

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

variable "endpoint" {
  description = "Base URL of the hosted OpenAI-compatible API (ends in /v1)."
  type        = string
  default     = "https://api.openai.com/v1"
}

variable "model" {
  description = "Model name the hosted API serves; clients use the same name."
  type        = string
  default     = "gpt-4o-mini"
}

variable "key_env" {
  description = "Environment variable of the router holding the hosted API key."
  type        = string
  default     = "OASIS_UPSTREAM_KEY_OPENAI"
}

job "hosted-openai-compat-fallback" {
  region      = var.region
  datacenters = var.datacenters
  type        = "service"

  group "hosted" {
    count = 1

    # The service leaves Consul (and the router) this long before the task stops. Nothing runs
    # here to drain: streams go from the router to the provider (README: Draining).
    shutdown_delay = "2s"

    network {
      port "http" {}
    }

    service {
      name     = "oasis-engine"
      provider = "consul"
      port     = "http"
      tags     = ["oasis", "engine-openai_compat", "role-both"]
      meta {
        oasis_model            = var.model
        oasis_engine           = "openai_compat"
        oasis_role             = "both"
        oasis_kv_events        = ""
        oasis_metrics_path     = ""
        oasis_block_size       = ""
        oasis_node             = "${node.unique.id}"
        oasis_upstream         = var.endpoint
        oasis_upstream_key_env = var.key_env
      }
    }

    restart {
      attempts = 10
      interval = "10m"
      delay    = "30s"
      mode     = "delay"
    }

    task "endpoint" {
      driver = "llm"

      config {
        engine   = "openai_compat"
        model    = var.model
        endpoint = var.endpoint
      }

      kill_timeout = "5s"

      resources {
        cpu    = 50
        memory = 32
      }
    }
  }
}
