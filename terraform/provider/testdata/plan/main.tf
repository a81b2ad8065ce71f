# Plan-time validation only: the provider points at addresses nothing
# listens on, and planning new resources reads nothing from them.
terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}

provider "oasis" {
  nomad_address  = "http://127.0.0.1:9"
  nomad_region   = "global"
  consul_address = "127.0.0.1:9"
  driver_policy = {
    allow_task_binary = var.allow_task_binary
  }
}

variable "allow_task_binary" {
  type    = bool
  default = false
}

variable "engine_binary" {
  type    = string
  default = null
}

variable "engine" {
  type    = string
  default = "vllm"
}

variable "kv_offload" {
  type    = string
  default = null
}

variable "engine_count" {
  type    = number
  default = 1
}

variable "router_variables" {
  type    = map(string)
  default = {}
}

resource "oasis_model" "m" {
  name         = "llama3-8b"
  engine       = var.engine
  model        = "meta-llama/Llama-3.1-8B-Instruct"
  engine_count = var.engine_count
  kv_offload   = var.kv_offload
  # Refused unless driver_policy allows task binaries.
  engine_binary = var.engine_binary
}

resource "oasis_system_jobs" "s" {
  router_variables = var.router_variables
  kvcached_enabled = false
}
