# Consul ACL policy of the oasis-kvcached job (jobs/kvcached.nomad.hcl) when peers are enabled:
# each kvcached finds the others through their health. Bound to its tasks' workload identity by
# jobs/acl/setup.sh. Without peers the task asks Consul nothing (Nomad registers its service with
# the service's own identity).
#
# With peer_datacenters the same rules must hold in the remote datacenters. Rules are not scoped
# to a datacenter and policies replicate from the primary, but the token must resolve there: a
# ?dc= query is forwarded with the caller's token, and a token local to another datacenter (what
# a workload identity's login makes) runs there as the anonymous token, which sees no instances.
# Give the job a global token with this policy (jobs/README.md, "kvcached in other datacenters").

service "oasis-kvcached" {
  policy = "read"
}

node_prefix "" {
  policy = "read"
}
