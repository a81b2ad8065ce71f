# The test bed's Oasis: the router and kvcached system jobs from the
# repository's jobspecs, and one simulated model. The provider reads the
# stack's addresses and tokens from the environment (NOMAD_ADDR, NOMAD_TOKEN,
# CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN).
terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}

provider "oasis" {
  kv_prefix = var.kv_prefix
}

variable "bin_dir" { type = string }
variable "consul_addr" { type = string }
variable "nomad_addr" { type = string }
variable "router_port" { type = number }
variable "kvcached_resp_port" { type = number }
variable "kvcached_http_port" { type = number }
variable "kvcached_quic_port" { type = number }
variable "kvcached_data_dir" { type = string }

variable "kv_prefix" {
  type    = string
  default = "oasis-e2e/tf"
}

variable "engine_count" {
  type    = number
  default = 2
}

variable "kvcached_enabled" {
  type    = bool
  default = true
}

variable "kv_offload" {
  type    = string
  default = null
}

resource "oasis_system_jobs" "this" {
  kvcached_enabled = var.kvcached_enabled
  router_variables = {
    oasis_bin_dir = var.bin_dir
    consul_addr   = var.consul_addr
    nomad_addr    = var.nomad_addr
    http_port     = var.router_port
    kv_prefix     = var.kv_prefix
    cpu           = 100
    memory        = 128
  }
  kvcached_variables = {
    oasis_bin_dir     = var.bin_dir
    consul_addr       = var.consul_addr
    resp_port         = var.kvcached_resp_port
    http_port         = var.kvcached_http_port
    quic_port         = var.kvcached_quic_port
    kv_events_address = "127.0.0.1"
    data_dir          = var.kvcached_data_dir
    ram_bytes         = "32MiB"
    disk_bytes        = "256MiB"
    memory_mb         = "128"
    auth_enabled      = "false" # the test's clients send no password (test/e2e/tiers covers it)
  }
}

resource "oasis_model" "sim" {
  name         = "tf-sim"
  engine       = "sim"
  model        = "tf-sim"
  engine_count = var.engine_count
  kv_offload   = var.kv_offload
  extra_args   = ["--speed", "0"]
  resources = {
    cpu    = 100
    memory = 128
  }
  timeout = "3m"
}

output "model_job_id" {
  value = oasis_model.sim.job_id
}

output "healthy_instances" {
  value = oasis_model.sim.healthy_instances
}

output "router_job_id" {
  value = oasis_system_jobs.this.router_job_id
}
