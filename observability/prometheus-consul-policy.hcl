# The Consul ACL policy Prometheus's consul_sd_configs need (observability/prometheus.yml): the
# catalog's services and their instances' nodes, and the local agent's self entry, where service
# discovery learns the datacenter when the scrape config names none. Put a token holding it in
# each consul_sd_configs entry's `token` (or its authorization).
#
#   consul acl policy create -name prometheus -rules @observability/prometheus-consul-policy.hcl
#   consul acl token create -description prometheus -policy-name prometheus
service_prefix "" {
  policy = "read"
}
node_prefix "" {
  policy = "read"
}
agent_prefix "" {
  policy = "read"
}
