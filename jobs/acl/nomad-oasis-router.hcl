# Nomad ACL policy of the oasis-router job (jobs/router.nomad.hcl), attached to the job by
# jobs/acl/setup.sh (`nomad acl policy apply -job oasis-router`): with -power-from-nomad the router
# reads each engine node's device statistics (/v1/client/stats), which needs node read. Its
# workload identity (NOMAD_TOKEN) carries this policy and nothing else.

node {
  policy = "read"
}
