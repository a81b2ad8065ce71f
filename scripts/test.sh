#!/usr/bin/env bash
# make test: everything CI runs, in an order that keeps a cold run (empty tool cache, empty Go build
# cache) short on a 2-core machine. The stages are the Makefile's own targets:
#
#   1. deps, then, in the background and at lower priority, the tools only some e2e packages use
#      (Jaeger, the Nomad Autoscaler, llama-server: about 23 minutes of a cold build), logged to
#      .oasis/test-late-tools.log;
#   2. in front: the other tools, lint, the licence check, the Terraform and Prometheus checks, the
#      unit tests and the Oasis commands;
#   3. the e2e packages that use none of the late tools, two at a time (each its own Consul + Nomad
#      stack on its own ports, bridge network and data directories: an e2e package spends most of
#      its time waiting on agents, so two share the cores);
#   4. once the background build is done, the e2e packages that use the late tools.
#
# A package is "late" when its Go files name one of those tools: testbed.AutoscalerBinary, RunJaeger
# or bin/llama-server. A warm run finds every tool cached and the background step ends at once.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
make=${MAKE:-make}
go=${GO:-go}
late_tools=(jaeger nomad-autoscaler llama-server)
early_tools=(nomad consul cni tofu tflint prometheus promtool)
late_pattern='AutoscalerBinary|RunJaeger|bin/llama-server'
e2e_parallel=${E2E_PARALLEL:-2} # as `make e2e`: `make test E2E_PARALLEL=1` runs them one at a time

"$make" --no-print-directory deps

mkdir -p .oasis
log=.oasis/test-late-tools.log
echo "test: $(date +%T) building ${late_tools[*]} in the background (log: $log); the e2e packages that use them run last"
# Its own process group (setsid), so that an interrupted or failed run takes the whole build down.
setsid nice -n 10 scripts/hashistack.sh "${late_tools[@]}" >"$log" 2>&1 &
late=$!
trap 'kill -TERM -- "-$late" 2>/dev/null || true' EXIT

scripts/hashistack.sh "${early_tools[@]}"
echo "test: $(date +%T) lint, licences, checks, unit tests"
"$make" --no-print-directory lint licenses terraform-check observability-check unit build

early=() later=()
while read -r pkg dir; do
	if grep -qE "$late_pattern" "$dir"/*.go 2>/dev/null; then
		later+=("$pkg")
	else
		early+=("$pkg")
	fi
done < <("$go" list -f '{{.ImportPath}} {{.Dir}}' ./test/e2e/... | grep -v -e '/testbed ' -e '/cmd/')

e2e() {
	OASIS_TESTBED_PREBUILT="$root/bin" "$go" test -count=1 -p "$e2e_parallel" -timeout 30m "$@"
}
echo "test: $(date +%T) e2e, ${#early[@]} packages, $e2e_parallel at a time"
e2e "${early[@]}"

if ! wait "$late"; then
	cat "$log" >&2
	echo "test: $(date +%T) building ${late_tools[*]} failed (above)" >&2
	exit 1
fi
trap - EXIT
grep -v 'still building' "$log" || true
echo "test: $(date +%T) e2e, ${#later[@]} packages that use ${late_tools[*]}, $e2e_parallel at a time"
e2e "${later[@]}"
