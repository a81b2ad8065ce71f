terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}

variable "kv_prefix" { type = string }
variable "load" {
  type    = number
  default = 0.2
}
variable "models" {
  type    = any
  default = {}
}

provider "oasis" {
  kv_prefix = var.kv_prefix
}

resource "oasis_router_policy" "p" {
  document = jsonencode({
    policy    = "weighted"
    weights   = { ttft = 2, prefix = 1, load = var.load }
    admission = { max_queue = 512, queue_timeout = "10s" }
    timeouts  = { stream_idle = "60s" }
    models    = var.models
  })
}

output "document" { value = oasis_router_policy.p.document }
output "key" { value = oasis_router_policy.p.key }
output "modify_index" { value = oasis_router_policy.p.modify_index }
