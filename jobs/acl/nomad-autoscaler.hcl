# Nomad ACL policy of the Nomad Autoscaler (jobs/README.md "Autoscaling"): it lists and reads the
# jobs' scaling policies, reads each job's scale status and changes a task group's count through
# the scale API. `scale` grants list-scaling-policies, read-scaling-policy, read-job-scaling and
# scale-job; read-job lets it see the job's allocations and deployments. Nothing else: it cannot
# submit or stop jobs. jobs/acl/setup.sh applies it; give the autoscaler a client token with it:
#
#   nomad acl token create -name nomad-autoscaler -policy nomad-autoscaler

namespace "default" {
  policy       = "scale"
  capabilities = ["read-job"]
}
