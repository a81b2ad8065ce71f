# Consul ACL policy of the oasis-router job (jobs/router.nomad.hcl), bound to its tasks' workload
# identity by jobs/acl/setup.sh. The least the router needs with the job's default variables
# (kv_prefix "oasis/router"); change the key paths with kv_prefix.

# Engines and node-local kvcached instances: the router watches their health (blocking queries).
service "oasis-engine" {
  policy = "read"
}

service "oasis-kvcached" {
  policy = "read"
}

# In the service mesh (mesh_enabled): the router's Connect leaf certificate and the
# authorization of its callers need write on its own service; read on a service includes reading
# the intentions naming it, which the router follows. Engines are reached at their sidecars,
# which Consul's Connect health answer lists under the sidecar's own name.
service "oasis-router" {
  policy = "write"
}

service "oasis-engine-sidecar-proxy" {
  policy = "read"
}

# Other datacenters' routers (federation), found through ?dc= queries.
service "oasis-router-federation" {
  policy = "read"
}

# A health answer carries each instance's node; Consul leaves out instances on nodes the token
# cannot read.
node_prefix "" {
  policy = "read"
}

# The routing policy and the API-key digests.
key_prefix "oasis/router/" {
  policy = "read"
}

# The router writes the default routing policy when the key is absent (check-and-set with index
# 0: it never overwrites a document).
key "oasis/router/policy" {
  policy = "write"
}
