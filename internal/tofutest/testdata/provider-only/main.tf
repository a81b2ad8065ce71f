terraform {
  required_providers {
    oasis = { source = "oasis-llm/oasis" }
  }
}
provider "oasis" {}
