# Oasis in two Nomad regions, one datacenter each, with router federation: each router serves
# its region's engines and forwards to the other region's router over HTTP/3 when the policy's
# federation section says the other side answers sooner. The federation certificates are items
# of each region's Nomad variable nomad/jobs/oasis-router (jobs/README.md, "Federation"); tokens
# come from the environment (NOMAD_TOKEN, CONSUL_HTTP_TOKEN) and must be valid in both regions
# (Nomad's and Consul's ACL replication make them so).
provider "oasis" {
  alias             = "east"
  nomad_address     = var.regions["east"].nomad_address
  nomad_region      = "east"
  consul_address    = var.regions["east"].consul_address
  consul_datacenter = var.regions["east"].datacenter
}

provider "oasis" {
  alias             = "west"
  nomad_address     = var.regions["west"].nomad_address
  nomad_region      = "west"
  consul_address    = var.regions["west"].consul_address
  consul_datacenter = var.regions["west"].datacenter
}

locals {
  router_variables = {
    api_keys_kv        = "true"
    federation_enabled = "true"
    federation_port    = tostring(var.federation_port)
    federation_models  = jsonencode([var.model_name])
  }

  # The same routing in both regions; federation on. Each datacenter's router reads its own
  # datacenter's Consul KV, so the document is written once per region.
  policy = jsonencode({
    policy  = "weighted"
    weights = { ttft = 2, prefix = 1, load = 0.2, power = 1.3 }
    admission = {
      max_in_flight = 0
      max_queue     = 1024
      queue_timeout = "30s"
    }
    federation = {
      enabled            = true
      margin             = "50ms"
      max_spill_fraction = 0.5
    }
  })

  model = {
    engine     = "vllm"
    kv_offload = "native"
    resources  = { cpu = 8000, memory = 65536, gpus = 1 }
  }
}

# Each router starts once its policy and key are in Consul KV and stops before they are deleted
# (a running router writes its default policy when the key is missing).
resource "oasis_system_jobs" "east" {
  depends_on = [oasis_router_policy.east, oasis_api_key.east]

  provider         = oasis.east
  region           = "east"
  datacenters      = [var.regions["east"].datacenter]
  router_variables = merge(local.router_variables, { federation_dc = var.regions["east"].datacenter })
}

resource "oasis_system_jobs" "west" {
  depends_on = [oasis_router_policy.west, oasis_api_key.west]

  provider         = oasis.west
  region           = "west"
  datacenters      = [var.regions["west"].datacenter]
  router_variables = merge(local.router_variables, { federation_dc = var.regions["west"].datacenter })
}

resource "oasis_model" "east" {
  provider     = oasis.east
  name         = var.model_name
  region       = "east"
  datacenters  = [var.regions["east"].datacenter]
  engine       = local.model.engine
  model        = var.model
  engine_count = var.model_count["east"]
  kv_offload   = local.model.kv_offload
  resources    = local.model.resources
}

resource "oasis_model" "west" {
  provider     = oasis.west
  name         = var.model_name
  region       = "west"
  datacenters  = [var.regions["west"].datacenter]
  engine       = local.model.engine
  model        = var.model
  engine_count = var.model_count["west"]
  kv_offload   = local.model.kv_offload
  resources    = local.model.resources
}

resource "oasis_router_policy" "east" {
  provider = oasis.east
  document = local.policy
}

resource "oasis_router_policy" "west" {
  provider = oasis.west
  document = local.policy
}

# Each datacenter's router reads the key document of its own datacenter: a key is made per
# region, and a client uses the key of the region it sends to (a forwarded request was
# authenticated where it entered).
resource "oasis_api_key" "east" {
  provider        = oasis.east
  key_id          = "team-a"
  rate_per_second = 10
  burst           = 20
}

resource "oasis_api_key" "west" {
  provider        = oasis.west
  key_id          = "team-a"
  rate_per_second = 10
  burst           = 20
}
