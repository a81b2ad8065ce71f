output "router_job_id" {
  description = "The router's system job."
  value       = oasis_system_jobs.this.router_job_id
}

output "model_job_id" {
  description = "The model deployment's Nomad job."
  value       = oasis_model.this.job_id
}

output "models" {
  description = "Models the router sees with healthy instances."
  value       = data.oasis_pool.this.model_names
}

output "api_keys" {
  description = "API key secrets by id (sensitive: `tofu output -json api_keys`)."
  value       = { for id, k in oasis_api_key.this : id => k.secret }
  sensitive   = true
}
