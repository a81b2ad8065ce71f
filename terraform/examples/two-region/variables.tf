variable "regions" {
  description = "The two Nomad regions and their Consul datacenters (one datacenter per region, Consul WAN-federated, Nomad regions federated): the provider configurations use each pair."
  type = map(object({
    nomad_address  = string
    consul_address = string
    datacenter     = string
  }))
  default = {
    east = { nomad_address = "https://nomad.east.example.com:4646", consul_address = "consul.east.example.com:8501", datacenter = "east" }
    west = { nomad_address = "https://nomad.west.example.com:4646", consul_address = "consul.west.example.com:8501", datacenter = "west" }
  }

  validation {
    condition     = length(var.regions) == 2 && contains(keys(var.regions), "east") && contains(keys(var.regions), "west")
    error_message = "The regions variable must name exactly the regions east and west (the provider configurations below are written for them)."
  }
}

variable "federation_port" {
  description = "UDP port of each router's HTTP/3 federation listener (jobs/router.nomad.hcl federation_port)."
  type        = number
  default     = 8443
}

variable "model_name" {
  description = "Name clients ask for, served in both regions."
  type        = string
  default     = "llama3-8b"
}

variable "model" {
  description = "The engine's model."
  type        = string
  default     = "meta-llama/Meta-Llama-3-8B-Instruct"
}

variable "model_count" {
  description = "vLLM instances of the model per region."
  type        = map(number)
  default = {
    east = 4
    west = 2
  }
}
