#!/usr/bin/env bash
# Installs the Debian packages some tests and benchmarks talk to (real Redis clients and server,
# nginx as the router's peer, iptables for the CNI plugins behind Nomad's bridge networking) and
# those that build llama-server (npm fetches its source, cmake and g++ compile it), when they are
# missing and this is a Debian machine we may change.
set -euo pipefail
need=()
command -v redis-cli >/dev/null 2>&1 || need+=(redis-tools)
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)
command -v nginx >/dev/null 2>&1 || need+=(nginx)
# /usr/sbin is not on every PATH; the CNI bridge, firewall and portmap plugins call iptables.
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)
# Podman (test/e2e/container: the llm driver's image tasks through Podman's REST API) and runc,
# which runs its containers on cgroups v1 hosts whose unified hierarchy holds a controller
# (crun 1.8 refuses that hybrid mode; see nomad-driver/README.md, "Engines from images").
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v runc >/dev/null 2>&1 || need+=(runc)
# A private registry (distribution 2.8) for test/e2e/container's authenticated pulls.
command -v docker-registry >/dev/null 2>&1 || need+=(docker-registry)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
command -v make >/dev/null 2>&1 || need+=(make)
[ ${#need[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
	echo "deps: missing ${need[*]}; install them with your package manager" >&2
	exit 1
fi
echo "deps: installing ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
# The packages start their system services; tests run their own instances on free ports.
for svc in redis-server nginx; do
	if command -v service >/dev/null 2>&1; then service "$svc" stop >/dev/null 2>&1 || true; fi
done
