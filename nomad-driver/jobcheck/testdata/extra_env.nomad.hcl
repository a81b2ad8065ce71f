# extra_env in a job file, written three ways. Nomad's job parser hands an
# object literal and a block on as a list of one map, a map-typed variable
# as the map itself; the client's schema and jobcheck take all three.
variable "env" {
  type    = map(string)
  default = { HF_HOME = "/data/hf" }
}

job "extra-env" {
  group "engine" {
    network {
      port "http" {}
    }
    task "literal" {
      driver = "llm"
      config {
        engine    = "sim"
        model     = "m"
        port      = "http"
        kv_events = false
        extra_env = { FOO = "bar", PYTHONHASHSEED = "0" }
      }
    }
    task "block" {
      driver = "llm"
      config {
        engine    = "sim"
        model     = "m"
        port      = "http"
        kv_events = false
        extra_env {
          FOO = "bar"
        }
      }
    }
    task "variable" {
      driver = "llm"
      config {
        engine    = "sim"
        model     = "m"
        port      = "http"
        kv_events = false
        extra_env = var.env
      }
    }
  }
}
