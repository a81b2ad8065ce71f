#!/usr/bin/env bash
# Applies the intentions Oasis needs (jobs/mesh/*.hcl, Consul service-intentions config entries)
# with the consul CLI. It honours CONSUL_HTTP_ADDR and CONSUL_HTTP_TOKEN (or
# CONSUL_HTTP_TOKEN_FILE); the token needs intentions write on oasis-router, oasis-engine and
# oasis-kvcached (service "<name>" { intentions = "write" }), or operator rights.
#
#   CONSUL_HTTP_ADDR=127.0.0.1:8500 CONSUL_HTTP_TOKEN=... jobs/mesh/apply.sh
#   CONSUL=/path/to/consul jobs/mesh/apply.sh
set -euo pipefail
dir=$(cd "$(dirname "$0")" && pwd)
consul=${CONSUL:-consul}
for f in "$dir"/oasis-router.hcl "$dir"/oasis-engine.hcl "$dir"/oasis-kvcached.hcl; do
	"$consul" config write "$f"
done
