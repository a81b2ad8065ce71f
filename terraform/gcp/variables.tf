variable "name" {
  description = "Name prefix of the instance template, the managed instance group and the instances."
  type        = string
  default     = "oasis-gpu"

  validation {
    condition     = can(regex("^[a-z]([-a-z0-9]{0,40}[a-z0-9])?$", var.name))
    error_message = "The name must be a GCE name prefix: lowercase letters, digits and '-', at most 42 characters."
  }
}

variable "project" {
  description = "GCP project."
  type        = string
}

variable "region" {
  description = "GCP region of the regional managed instance group."
  type        = string
}

variable "zones" {
  description = "Zones of the region the group spreads over (those that offer the GPU); empty lets GCE choose."
  type        = list(string)
  default     = []
}

variable "source_image" {
  description = "Boot image: one with cloud-init and the NVIDIA driver installed (a self link or family URL)."
  type        = string
}

variable "machine_type" {
  description = "Machine type. A2, A3 and G2 types include their GPUs (leave gpu_count at 0); N1 types take GPUs through gpu_type and gpu_count."
  type        = string
  default     = "g2-standard-8"
}

variable "gpu_type" {
  description = "guest_accelerator type for N1 machine types (nvidia-tesla-t4, nvidia-tesla-v100, ...)."
  type        = string
  default     = "nvidia-tesla-t4"
}

variable "gpu_count" {
  description = "guest_accelerator count; 0 for machine types that include their GPUs."
  type        = number
  default     = 0
}

variable "target_size" {
  description = "Instances the group keeps running."
  type        = number
  default     = 1
}

variable "network" {
  description = "VPC network (name or self link)."
  type        = string
}

variable "subnetwork" {
  description = "Subnetwork in the region (name or self link)."
  type        = string
}

variable "assign_public_ip" {
  description = "Give instances an ephemeral external IP (otherwise they need Cloud NAT to reach the release URL and apt.releases.hashicorp.com)."
  type        = bool
  default     = false
}

variable "network_tags" {
  description = "Network tags of the instances (firewall rules; cloud auto-join with provider=gce matches tag_value)."
  type        = list(string)
  default     = ["oasis-gpu-node", "nomad-client", "consul-client"]
}

variable "service_account_email" {
  description = "Service account of the instances; empty for the project's default compute account. Cloud auto-join (provider=gce) needs compute.instances.list."
  type        = string
  default     = ""
}

variable "boot_disk_size_gb" {
  description = "Boot disk (pd-balanced) size."
  type        = number
  default     = 200
}

variable "kvcached_disk_size_gb" {
  description = "Size of a pd-ssd for kvcached's disk tier (device name kvcached, /dev/disk/by-id/google-kvcached in the instance); 0 for none (a directory on the boot disk)."
  type        = number
  default     = 500
}

variable "nomad_servers" {
  description = "Nomad server_join.retry_join: addresses or a GCE cloud auto-join string."
  type        = list(string)
  default     = ["provider=gce tag_value=nomad-server"]
}

variable "consul_retry_join" {
  description = "Consul retry_join: addresses or a GCE cloud auto-join string."
  type        = list(string)
  default     = ["provider=gce tag_value=consul-server"]
}

variable "labels" {
  description = "Labels on the template's instances and disks."
  type        = map(string)
  default     = {}
}
