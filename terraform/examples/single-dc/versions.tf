terraform {
  required_version = ">= 1.6.0"

  required_providers {
    oasis = {
      source  = "oasis-llm/oasis"
      version = "~> 0.1"
    }
  }
}
