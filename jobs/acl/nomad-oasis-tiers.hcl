# Nomad ACL policy of engine jobs that name a KV offload tier (kv_offload_tier in the llm driver's
# task config), attached to each such job by jobs/acl/setup.sh (OASIS_TIER_JOBS). The llm driver
# reads the tier's declaration (oasis/tiers/<name>) and the secret it references with the task's
# own workload identity when the task starts: this policy is what lets it.
#
# The kvcached tier's password is item redis_password of nomad/jobs/oasis-kvcached, the variable
# the oasis-kvcached job reads it from. Nomad's ACLs grant variables whole, so engines holding this
# policy can also read that variable's other items (with peers: kvcached's TLS key and Consul
# token); keep those in a variable of their own where engines and kvcached do not share a trust
# boundary.

namespace "default" {
  variables {
    path "oasis/tiers/*" {
      capabilities = ["read"]
    }
    path "nomad/jobs/oasis-kvcached" {
      capabilities = ["read"]
    }
  }
}
