locals {
  kvcached = var.kvcached_disk_size_gb > 0
  labels   = merge({ "oasis-role" = "gpu-node" }, var.labels)
}

module "node" {
  source = "../modules/nomad-gpu-client"

  oasis_release_url    = var.oasis_release_url
  oasis_release_sha256 = var.oasis_release_sha256
  nomad_version        = var.nomad_version
  consul_version       = var.consul_version
  region               = var.nomad_region
  datacenter           = var.datacenter
  node_pool            = var.node_pool
  node_class           = var.machine_type
  meta                 = merge({ "oasis.machine_type" = var.machine_type }, var.meta)
  nomad_servers        = var.nomad_servers
  consul_retry_join    = var.consul_retry_join
  llm_engine_binaries  = var.llm_engine_binaries
  kvcached_device      = local.kvcached ? "/dev/disk/by-id/google-kvcached" : ""
  consul_agent_token   = var.consul_agent_token
  nomad_consul_token   = var.nomad_consul_token
  consul_gossip_key    = var.consul_gossip_key
}

resource "google_compute_instance_template" "gpu" {
  project      = var.project
  name_prefix  = "${var.name}-"
  machine_type = var.machine_type
  region       = var.region
  tags         = var.network_tags
  labels       = local.labels

  # cloud-init reads the user-data key.
  metadata = {
    user-data              = module.node.user_data
    block-project-ssh-keys = "true"
  }

  disk {
    source_image = var.source_image
    disk_type    = "pd-balanced"
    disk_size_gb = var.boot_disk_size_gb
    boot         = true
    auto_delete  = true
    labels       = local.labels
  }

  dynamic "disk" {
    for_each = local.kvcached ? [1] : []
    content {
      device_name  = "kvcached"
      disk_type    = "pd-ssd"
      disk_size_gb = var.kvcached_disk_size_gb
      auto_delete  = true
      labels       = local.labels
    }
  }

  dynamic "guest_accelerator" {
    for_each = var.gpu_count > 0 ? [1] : []
    content {
      type  = var.gpu_type
      count = var.gpu_count
    }
  }

  # GPU instances cannot live-migrate.
  scheduling {
    on_host_maintenance = "TERMINATE"
    automatic_restart   = true
  }

  network_interface {
    network    = var.network
    subnetwork = var.subnetwork

    dynamic "access_config" {
      for_each = var.assign_public_ip ? [1] : []
      content {}
    }
  }

  service_account {
    email  = var.service_account_email == "" ? null : var.service_account_email
    scopes = ["cloud-platform"]
  }

  shielded_instance_config {
    enable_secure_boot          = false # secure boot refuses unsigned kernel modules (a self-built NVIDIA driver)
    enable_integrity_monitoring = true
    enable_vtpm                 = true
  }

  lifecycle {
    create_before_destroy = true
  }
}

resource "google_compute_region_instance_group_manager" "gpu" {
  project                   = var.project
  name                      = "${var.name}-mig"
  region                    = var.region
  base_instance_name        = var.name
  target_size               = var.target_size
  distribution_policy_zones = length(var.zones) > 0 ? var.zones : null

  version {
    instance_template = google_compute_instance_template.gpu.self_link_unique
  }

  # A new template (new release, new config) replaces instances one at a time; GPU instances
  # cannot be surged beyond quota, so none are added while replacing. A regional group needs 0 or
  # at least one per zone (GCE spreads over three when zones is empty).
  update_policy {
    type                         = "PROACTIVE"
    minimal_action               = "REPLACE"
    instance_redistribution_type = "NONE"
    max_surge_fixed              = 0
    max_unavailable_fixed        = length(var.zones) > 0 ? length(var.zones) : 3
  }
}
