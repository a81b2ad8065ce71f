terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}

variable "kv_prefix" { type = string }
variable "key_a" {
  type    = string
  default = "team-a"
}
variable "rate_a" {
  type    = number
  default = 10
}

provider "oasis" {
  kv_prefix = var.kv_prefix
}

resource "oasis_api_key" "a" {
  key_id          = var.key_a
  rate_per_second = var.rate_a
  burst           = 20
}

resource "oasis_api_key" "b" {
  key_id = "team-b"
}

resource "oasis_api_key" "c" {
  key_id          = "team-c"
  rate_per_second = 1
}

output "secrets" {
  value     = { a = oasis_api_key.a.secret, b = oasis_api_key.b.secret, c = oasis_api_key.c.secret }
  sensitive = true
}
