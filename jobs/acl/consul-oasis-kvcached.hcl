# Consul ACL policy of the oasis-kvcached job (jobs/kvcached.nomad.hcl) when peers are enabled:
# each kvcached finds the others through their health and, with mesh = true, takes its identity
# from Consul Connect. Bound to its tasks' workload identity by jobs/acl/setup.sh. Without peers
# the task asks Consul nothing (Nomad registers its service with the service's own identity).
#
# With peer_datacenters the same rules must hold in the remote datacenters. Rules are not scoped
# to a datacenter and policies replicate from the primary, but the token must resolve there: a
# ?dc= query is forwarded with the caller's token, and a token local to another datacenter (what
# a workload identity's login makes) runs there as the anonymous token, which sees no instances.
# Give the job a global token with this policy (jobs/README.md, "kvcached in other datacenters").

# write, not read, for the mesh (mesh = true): the task's Connect leaf certificate for
# oasis-kvcached and the authorization of callers against intentions both need service:write on
# it; reading the intentions that name it as destination comes with that. Without the mesh read
# would do, but the role binds to the job whatever its variables. No other service is writable,
# and intentions themselves are not (no intentions = "write").
service "oasis-kvcached" {
  policy = "write"
}

node_prefix "" {
  policy = "read"
}
