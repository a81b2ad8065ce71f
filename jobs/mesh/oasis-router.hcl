# Who may call the router (jobs/router.nomad.hcl with mesh_enabled): Consul service-intentions
# config entry, applied by jobs/mesh/apply.sh (make up MESH=1 runs it). Other datacenters'
# routers forward to it over the federation link (router ↔ router); your clients are added as
# sources, one block each. Everything else is denied, whatever the cluster's default.
Kind = "service-intentions"
Name = "oasis-router"
Sources = [
  {
    Name        = "oasis-router"
    Action      = "allow"
    Description = "router federation: other datacenters' routers"
  },
  {
    Name        = "oasis-client"
    Action      = "allow"
    Description = "the example client of make up MESH=1 (replace with your services)"
  },
  {
    Name   = "*"
    Action = "deny"
  },
]
