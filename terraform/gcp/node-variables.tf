# --- Passed to modules/nomad-gpu-client (see its README for every input) ---

variable "oasis_release_url" {
  description = "https URL of the Oasis release tarball for the instances' architecture (make dist)."
  type        = string
}

variable "oasis_release_sha256" {
  description = "SHA-256 of that tarball (its line in SHA256SUMS); the node refuses anything else."
  type        = string
}

variable "nomad_version" {
  description = "Nomad version installed from HashiCorp's apt repository."
  type        = string
  default     = "1.11.0"
}

variable "consul_version" {
  description = "Consul version installed from HashiCorp's apt repository."
  type        = string
  default     = "1.22.0"
}

variable "nomad_region" {
  description = "Nomad region of the clients."
  type        = string
  default     = "global"
}

variable "datacenter" {
  description = "Nomad and Consul datacenter of the clients."
  type        = string
  default     = "dc1"
}

variable "node_pool" {
  description = "Nomad node pool of the clients."
  type        = string
  default     = "gpu"
}

variable "meta" {
  description = "Nomad client meta."
  type        = map(string)
  default     = {}
}

variable "llm_engine_binaries" {
  description = "Engine executables present in the image (vllm, sglang, llama_cpp, trtllm) for the llm driver's binaries map."
  type        = map(string)
  default     = {}
}

variable "consul_agent_token" {
  description = "Consul agent token written into user-data (mode 0600 on the node). Empty: deliver it out of band (README)."
  type        = string
  default     = ""
  sensitive   = true
}

variable "nomad_consul_token" {
  description = "The Nomad agent's Consul token written into user-data (mode 0600 on the node). Empty: deliver it out of band (README)."
  type        = string
  default     = ""
  sensitive   = true
}

variable "consul_gossip_key" {
  description = "Consul gossip key written into user-data (mode 0600 on the node). Empty: deliver it out of band (README)."
  type        = string
  default     = ""
  sensitive   = true
}
