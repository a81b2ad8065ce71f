output "instance_template" {
  description = "Self link of the GPU nodes' instance template."
  value       = google_compute_instance_template.gpu.self_link_unique
}

output "instance_group_manager" {
  description = "The regional managed instance group."
  value       = google_compute_region_instance_group_manager.gpu.id
}

output "instance_group" {
  description = "The instance group (for load balancer backends)."
  value       = google_compute_region_instance_group_manager.gpu.instance_group
}

output "nomad_client_config" {
  description = "The Nomad client configuration every instance runs (no secrets)."
  value       = module.node.nomad_client_config
}
