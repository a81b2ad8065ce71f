# Consul ACL policy of the oasis-kvcached job (jobs/kvcached.nomad.hcl) when peers are enabled:
# each kvcached finds the others through their health. Bound to its tasks' workload identity by
# jobs/acl/setup.sh. Without peers the task asks Consul nothing (Nomad registers its service with
# the service's own identity).

service "oasis-kvcached" {
  policy = "read"
}

node_prefix "" {
  policy = "read"
}
