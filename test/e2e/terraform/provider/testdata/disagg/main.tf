# A disaggregated simulated model: prefill and decode engines exchanging KV
# over the simulator's NIXL stand-in.
terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}

provider "oasis" {}

resource "oasis_model" "pd" {
  name          = "tf-sim-pd"
  engine        = "sim"
  model         = "tf-sim-pd"
  role          = "disaggregated"
  prefill_count = 1
  decode_count  = 2
  extra_args    = ["--speed", "0"]
  resources = {
    cpu    = 100
    memory = 128
  }
  timeout = "1m"
}

output "healthy_instances" {
  value = oasis_model.pd.healthy_instances
}
