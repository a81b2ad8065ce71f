# Oasis in one datacenter: the router and kvcached on every node, one model, the router's
# policy and its API keys. The provider reads NOMAD_ADDR, NOMAD_TOKEN, CONSUL_HTTP_ADDR and
# CONSUL_HTTP_TOKEN from the environment, as the nomad and consul CLIs do.
provider "oasis" {}

# The router starts once its policy and keys are in Consul KV, and is stopped before they are
# deleted: a running router writes its default policy when the key is missing.
resource "oasis_system_jobs" "this" {
  depends_on = [oasis_router_policy.this, oasis_api_key.this]

  region           = var.region
  datacenters      = var.datacenters
  router_variables = merge({ api_keys_kv = "true" }, var.router_variables)

  kvcached_enabled   = var.kvcached_enabled
  kvcached_variables = var.kvcached_variables
}

resource "oasis_model" "this" {
  name          = var.model_name
  region        = var.region
  datacenters   = var.datacenters
  engine        = var.engine
  model         = var.model
  engine_count  = var.model_count
  kv_offload    = var.kv_offload
  engine_binary = var.engine_binary
  extra_args    = var.extra_args
  resources     = var.resources
}

resource "oasis_router_policy" "this" {
  document = jsonencode({
    policy  = var.routing_policy
    weights = var.weights
    admission = {
      max_in_flight = 0
      max_queue     = var.max_queue
      queue_timeout = "30s"
    }
  })
}

resource "oasis_api_key" "this" {
  for_each = var.api_keys

  key_id          = each.key
  rate_per_second = each.value.rate_per_second
  burst           = each.value.burst
}

# What the router serves once the model is healthy.
data "oasis_pool" "this" {
  depends_on = [oasis_model.this]
}
