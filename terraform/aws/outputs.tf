output "launch_template_id" {
  description = "Id of the GPU nodes' launch template."
  value       = aws_launch_template.gpu.id
}

output "launch_template_version" {
  description = "Its latest version (changes with the release, the configs or the instance settings)."
  value       = aws_launch_template.gpu.latest_version
}

output "autoscaling_group_name" {
  description = "Name of the GPU nodes' autoscaling group."
  value       = aws_autoscaling_group.gpu.name
}

output "nomad_client_config" {
  description = "The Nomad client configuration every instance runs (no secrets)."
  value       = module.node.nomad_client_config
}
