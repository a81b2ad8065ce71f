output "router_job_ids" {
  description = "The router's system job in each region."
  value = {
    east = oasis_system_jobs.east.router_job_id
    west = oasis_system_jobs.west.router_job_id
  }
}

output "api_keys" {
  description = "The team-a key of each region (sensitive: `tofu output -json api_keys`)."
  value = {
    east = oasis_api_key.east.secret
    west = oasis_api_key.west.secret
  }
  sensitive = true
}
