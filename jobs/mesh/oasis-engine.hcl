# Who may call engines (service oasis-engine, reached at their sidecars or Connect-native
# listeners): the router alone. A client that could call engines directly would bypass the
# router's API keys, admission and KV-aware placement.
Kind = "service-intentions"
Name = "oasis-engine"
Sources = [
  {
    Name        = "oasis-router"
    Action      = "allow"
    Description = "the router proxies requests, scrapes /metrics and calls /tokenize"
  },
  {
    Name   = "*"
    Action = "deny"
  },
]
