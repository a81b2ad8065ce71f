# oasis-kvcached configuration: every key with its default, unless a comment says otherwise.
# kvcached/README.md "Configuration" says what each key means and which flag it stands for.
#
#   oasis-kvcached --config kvcached.hcl           # or --config /etc/oasis/kvcached.d
#   oasis-kvcached --config kvcached.hcl --log-level debug   # a flag on the command line wins

log_level = "info"

listeners {
  resp           = "127.0.0.1:6380" # Redis protocol (loopback: engines on this node)
  http           = "127.0.0.1:9380" # /metrics and /health; "" disables
  quic           = ""               # peers over QUIC; "" disables peers
  quic_advertise = ""
}

tls {
  ca             = ""
  cert           = ""
  key            = ""
  server_name    = "oasis-kvcached"
  verify_address = false
}

tiers {
  ram {
    bytes = "1GiB" # the process's memory budget; RSS stays within it + 10%
  }
  disk {
    bytes = 0 # e.g. "64GiB", with dir
    dir   = ""
  }
}

peers {
  static                = []
  consul_addr           = "" # default: $CONSUL_HTTP_ADDR
  consul_service        = "oasis-kvcached"
  mesh                  = false
  timeout               = "2s"
  filter_interval       = "2s"
  datacenters           = []
  wan_timeout           = "5s"
  wan_bytes_per_second  = "100MiB"
  wan_discovery_timeout = "10s"
}

auth {
  password_file = "" # or $OASIS_KVCACHED_PASSWORD; none by default
  timeout       = "10s"
}

limits {
  max_value_bytes = "64MiB"
  idle_timeout    = "5m"
}

telemetry {
  pprof = false
  kv_events {
    endpoint        = ""
    replay_endpoint = ""
    block_size      = 256
  }
}
