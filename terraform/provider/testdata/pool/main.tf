terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}

provider "oasis" {}

data "oasis_pool" "this" {}

data "oasis_pool" "hosted" {
  hosted_upstreams = ["https://api.example.com/v1"]
}

data "oasis_pool" "tagged" {
  tag = "blue"
}

output "model_names" { value = data.oasis_pool.this.model_names }
output "models" { value = data.oasis_pool.this.models }
output "hosted_model_names" { value = data.oasis_pool.hosted.model_names }
output "tagged_model_names" { value = data.oasis_pool.tagged.model_names }
