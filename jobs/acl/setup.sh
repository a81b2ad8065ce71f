#!/bin/sh
# Creates or updates the Consul and Nomad ACL objects the Oasis system jobs need, from the policy
# files beside this script. Safe to run again (after changing a policy file, for instance).
#
#   jobs/acl/setup.sh
#
# Needs the consul and nomad CLIs with CONSUL_HTTP_ADDR / CONSUL_HTTP_TOKEN and NOMAD_ADDR /
# NOMAD_TOKEN allowed to write ACLs (acl = "write" in Consul, a management token in Nomad), and
# Consul's JWT auth method for Nomad workload identities (`nomad setup consul` creates it, named
# nomad-workloads).
#
# Environment:
#   OASIS_CONSUL_AUTH_METHOD  the auth method's name (default nomad-workloads)
#   OASIS_NOMAD_NAMESPACE     the Nomad namespace the jobs run in (default default)
#   OASIS_TIER_JOBS           engine job ids (space-separated) whose tasks name a kv_offload_tier: each
#                             gets policy oasis-tiers-<job> (nomad-oasis-tiers.hcl), which lets the llm
#                             driver read tier declarations and the kvcached password with the task's
#                             workload identity
set -eu

here=$(cd "$(dirname "$0")" && pwd)
method=${OASIS_CONSUL_AUTH_METHOD:-nomad-workloads}
namespace=${OASIS_NOMAD_NAMESPACE:-default}

# consul_job_policy JOB: policy and role named JOB from consul-JOB.hcl, and a binding rule giving
# the role to the job's tasks (not to its services, which get service identities).
consul_job_policy() {
	job=$1
	rules="@$here/consul-$job.hcl"
	if consul acl policy read -name "$job" >/dev/null 2>&1; then
		consul acl policy update -name "$job" -rules "$rules" >/dev/null
	else
		consul acl policy create -name "$job" -description "Oasis $job tasks" -rules "$rules" >/dev/null
	fi
	if ! consul acl role read -name "$job" >/dev/null 2>&1; then
		consul acl role create -name "$job" -description "Oasis $job tasks" -policy-name "$job" >/dev/null
	fi
	selector="\"nomad_service\" not in value and value.nomad_namespace == \"$namespace\" and value.nomad_job_id == \"$job\""
	if ! consul acl binding-rule list -method "$method" -format json | grep -qF "\"BindName\": \"$job\""; then
		consul acl binding-rule create -method "$method" -bind-type role -bind-name "$job" \
			-description "Oasis $job tasks" -selector "$selector" >/dev/null
	fi
	echo "consul: policy, role and binding rule $job (auth method $method)"
}

consul_job_policy oasis-router
consul_job_policy oasis-kvcached

nomad acl policy apply -namespace "$namespace" -job oasis-router \
	-description "Oasis router: node statistics for power-aware routing" \
	oasis-router "$here/nomad-oasis-router.hcl" >/dev/null
echo "nomad: policy oasis-router attached to job $namespace/oasis-router"

for job in ${OASIS_TIER_JOBS:-}; do
	sed "s/namespace \"default\"/namespace \"$namespace\"/" "$here/nomad-oasis-tiers.hcl" |
		nomad acl policy apply -namespace "$namespace" -job "$job" \
			-description "Oasis KV offload tiers for $job" "oasis-tiers-$job" - >/dev/null
	echo "nomad: policy oasis-tiers-$job attached to job $namespace/$job"
done
# The Nomad Autoscaler is not one of these jobs' tasks: the policy is applied unattached, and its
# token is made from it (jobs/README.md "Autoscaling").
nomad acl policy apply -namespace "$namespace" \
	-description "Nomad Autoscaler: read and scale jobs' task groups" \
	nomad-autoscaler "$here/nomad-autoscaler.hcl" >/dev/null
echo "nomad: policy nomad-autoscaler (nomad acl token create -name nomad-autoscaler -policy nomad-autoscaler)"
