variable "region" {
  description = "Nomad region Oasis runs in."
  type        = string
  default     = "global"
}

variable "datacenters" {
  description = "Nomad datacenters the system jobs and the model run in."
  type        = list(string)
  default     = ["*"]
}

variable "router_variables" {
  description = "Variables of jobs/router.nomad.hcl beyond what this example sets (api_keys_kv), e.g. oasis_bin_dir, http_port, artifact_url and artifact_checksum."
  type        = map(string)
  default     = {}
}

variable "kvcached_enabled" {
  description = "Run oasis-kvcached (jobs/kvcached.nomad.hcl) on every node."
  type        = bool
  default     = true
}

variable "kvcached_variables" {
  description = "Variables of jobs/kvcached.nomad.hcl. kvcached requires its Redis password by default: put it in Nomad variable nomad/jobs/oasis-kvcached/kvcached (item redis_password) first, or set auth_enabled = \"false\"."
  type        = map(string)
  default     = {}
}

variable "model_name" {
  description = "Name clients ask for (the OpenAI API's model)."
  type        = string
  default     = "tiny-sim"
}

variable "engine" {
  description = "Engine of the model deployment, as the llm driver names it: vllm, sglang, llama_cpp, trtllm or sim (oasis-sim, no GPU)."
  type        = string
  default     = "sim"
}

variable "model" {
  description = "The engine's model (a Hugging Face id or a path on the nodes)."
  type        = string
  default     = "tiny-sim"
}

variable "model_count" {
  description = "Engine instances of the model."
  type        = number
  default     = 2
}

variable "engine_binary" {
  description = "Path of the engine's binary on the nodes; null lets the llm driver find it (its binaries map or PATH)."
  type        = string
  default     = null
}

variable "extra_args" {
  description = "Engine arguments the llm driver does not render itself."
  type        = list(string)
  default     = []
}

variable "kv_offload" {
  description = "Where engines offload KV blocks, as the llm driver names it: none, native, lmcache, kvcached, nixl, hicache, kvbm or flexkv (what the engine supports is checked at plan)."
  type        = string
  default     = "none"
}

variable "resources" {
  description = "Resources of each engine instance: CPU in MHz, memory in MiB, GPUs (nvidia/gpu devices)."
  type = object({
    cpu    = number
    memory = number
    gpus   = number
  })
  default = {
    cpu    = 200
    memory = 128
    gpus   = 0
  }
}

variable "routing_policy" {
  description = "The router's policy: weighted (the default: KV-cache affinity weighed against time to first token, load and power), round_robin or least_load."
  type        = string
  default     = "weighted"
}

variable "weights" {
  description = "Terms of the weighted policy and their weights (router/README.md, \"Policy document\"); these are the router's defaults."
  type        = map(number)
  default = {
    ttft   = 2
    prefix = 1
    load   = 0.2
    power  = 1.3
  }
}

variable "max_queue" {
  description = "Requests that may wait for an admission slot per model before the router answers 429."
  type        = number
  default     = 1024
}

variable "api_keys" {
  description = "API keys the router accepts, by id, with their rate limits (0: unlimited). The secrets are generated and kept only in the state (output api_keys)."
  type = map(object({
    rate_per_second = number
    burst           = number
  }))
  default = {
    team-a = { rate_per_second = 10, burst = 20 }
  }
}
