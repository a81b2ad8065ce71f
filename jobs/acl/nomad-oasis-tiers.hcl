# Nomad ACL policy of engine jobs that name a KV offload tier (kv_offload_tier in the llm driver's
# task config), attached to each such job by jobs/acl/setup.sh (OASIS_TIER_JOBS). The llm driver
# reads the tier's declaration (oasis/tiers/<name>) and the secret it references with the task's
# own workload identity when the task starts: this policy is what lets it.
#
# The kvcached tier's password is item redis_password of nomad/jobs/oasis-kvcached/kvcached, a
# variable that holds nothing else: the oasis-kvcached job's tasks read it without a policy (it is
# their task group's variable). Nomad grants a variable whole and matches a path without a glob
# exactly, so engines holding this policy read that variable and no other under
# nomad/jobs/oasis-kvcached: not the job's own variable, nomad/jobs/oasis-kvcached, with kvcached's
# TLS key and Consul token (test/e2e/tiers checks this with an engine's workload identity).

namespace "default" {
  variables {
    path "oasis/tiers/*" {
      capabilities = ["read"]
    }
    path "nomad/jobs/oasis-kvcached/kvcached" {
      capabilities = ["read"]
    }
  }
}
