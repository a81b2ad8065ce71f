# oasis-router configuration: every key with its default, unless a comment says otherwise.
# router/README.md "Configuration" says what each key means and which flag it stands for.
#
#   oasis-router -config router.hcl            # or -config /etc/oasis/router.d (its *.hcl, *.json in order)
#   oasis-router -config router.hcl -log-level debug   # a flag on the command line wins

log_level        = "info"
log_json         = false
shutdown_timeout = "60s"

listeners {
  api       = "127.0.0.1:8080" # "off": no plain listener (mesh clients only)
  advertise = ""               # default: the bound api address
  register  = false
  pprof     = ""
}

tls {
  cert      = ""
  key       = ""
  client_ca = ""
}

discovery {
  source           = "consul"
  consul_addr      = "" # default: $CONSUL_HTTP_ADDR, else 127.0.0.1:8500
  nomad_addr       = "" # default: $NOMAD_ADDR
  service          = "oasis-engine"
  service_tag      = ""
  engines          = [] # source = "static" only, e.g. ["llama-3-8b=127.0.0.1:9001@sim"]
  kvcached_service = "oasis-kvcached"
  hosted_upstreams = []
  hosted_key_envs  = []
}

cors {
  origins = [] # CORS off; e.g. ["https://app.example"] or ["*"]
  methods = [] # default GET, POST
  headers = [] # default Authorization, Content-Type, X-Request-Id; ["*"]: those asked
}

policy {
  kv_prefix            = "oasis/router"
  file                 = ""
  api_keys_file        = ""
  api_keys_kv          = false
  response_id_key_file = ""
}

federation {
  listen     = "" # set to serve other datacenters' routers over HTTP/3
  advertise  = ""
  datacenter = ""
  tls_cert   = ""
  tls_key    = ""
  tls_ca     = ""
}

peers {
  listen    = "" # set (with listeners.register) to share admission and key limits with the datacenter's routers
  advertise = ""
  key_file  = "" # base64 gossip key; required unless listen is loopback
  interval     = "200ms" # the longest time between two load messages (heartbeat)
  min_interval = "10ms"  # the shortest: a router sends on change, at most this often
  node         = ""      # the Nomad node id: the registration with meta oasis_node = it is this router's
}

mesh {
  service = ""
  listen  = ""
  engines = false
}

limits {
  max_body_bytes             = "16MiB"
  max_header_bytes           = "1MiB"
  body_read_timeout          = "30s"
  max_connections            = 4096
  max_connections_per_source = 1024
  eject_after                = 3 # 0: never
  eject_for                  = "10s"
  index_max_blocks           = 4194304
  index_worker_max_blocks    = 2097152
  kvcached_max_blocks        = 65536
  max_loaded_adapters        = 4
}

telemetry {
  metrics {
    scrape_interval  = "1s"
    power_from_nomad = false
  }
  tracing {
    otlp_endpoint = ""
    sample_ratio  = 0.05
  }
}

runtime {
  gc_percent   = 400
  gomaxprocs   = 0
  memory_limit = 0
}
