# A model whose engine cannot start: apply must time out naming the
# allocations' task states.
terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}

# The test bed's clients set allow_task_binary = true in the llm plugin
# config; the plan checks engine_binary against what this states.
provider "oasis" {
  driver_policy = {
    allow_task_binary = true
  }
}

resource "oasis_model" "broken" {
  name          = "tf-broken"
  engine        = "sim"
  model         = "tf-broken"
  engine_binary = "/nonexistent/oasis-sim"
  resources = {
    cpu    = 100
    memory = 64
  }
  timeout = "15s"
}
