#!/usr/bin/env bash
# The router in the Consul service mesh against the plain router, in one run,
# against the same oasis-sim engines (issue #21): added latency and CPU per
# request. Everything binds 127.0.0.1 on free ports and is stopped on exit.
#
#   bench/router-mesh.sh [routerload flags...]
#   e.g. bench/router-mesh.sh -rate 1000 -round 2s -rounds 5 -max-tokens 4
#
# What runs:
# - a Consul dev agent (bin/consul, `make hashistack`; Connect on, no DNS or
#   gRPC) with default-deny intentions: web → oasis-router, oasis-router →
#   oasis-engine, and web → oasis-engine (for the direct-sidecar target only);
# - ENGINES oasis-sim engines, each registered as oasis-engine (meta
#   oasis_model=m, oasis_engine=sim) with a SidecarService, and Consul's
#   built-in L4 proxy `consul connect proxy -sidecar-for` as its sidecar (not
#   Envoy, which cannot be installed here);
# - router: -discovery consul (engines at their own plain addresses), TLS on
#   its listener (a throwaway openssl CA and ECDSA P-256 certificate, as
#   bench/router-vs-nginx.sh does by default; TLS=0: plain HTTP);
# - router-mesh: the same build, policy and discovery with -mesh-service
#   oasis-router -mesh-listen ... -mesh-engines -listen off: callers present a
#   Connect certificate, engines reached through their sidecars with the
#   router's leaf.
# routerload is the mesh service `web` for the mesh targets (its leaf and
# roots from the agent via internal/meshid, the server checked as
# oasis-router or oasis-engine by SPIFFE ID). Targets, rotated per round:
#   direct          client → engine (plain HTTP)
#   direct-sidecar  client → sidecar → engine (client mTLS to the sidecar)
#   router          client → router (TLS) → engine (plain)
#   router-mesh     client → router (mTLS) → sidecar (mTLS) → engine
# CPU per request (-cpu-pids): each router; the sidecars (one wrapper process,
# its children summed) and the Consul agent while router-mesh or
# direct-sidecar is loaded.
#
# Env: ENGINES (default 3), SIM_SPEED (default 1), TLS (default 1),
#   POLICY_JSON (a policy document; default: the shipped policy.Default()),
#   ENGINE_KIND (default sim), PPROF=<seconds> (CPU profile of router-mesh
#   during the run, `go tool pprof -top` printed at the end; with it the
#   router-mesh process serves -pprof-listen), KEEP=1 (leave the temp dir with
#   the logs).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/tls.sh
. bench/tls.sh
ENGINES=${ENGINES:-3}
SIM_SPEED=${SIM_SPEED:-1}
TLS=${TLS:-1}
ENGINE_KIND=${ENGINE_KIND-sim}
PPROF=${PPROF:-}
CONSUL=${OASIS_CONSUL_BIN:-$PWD/bin/consul}
[ -x "$CONSUL" ] || { echo "no consul at $CONSUL: make hashistack (or OASIS_CONSUL_BIN=...)" >&2; exit 1; }

work=$(mktemp -d /tmp/oasis-mesh-bench.XXXXXX)
pids=()
cleanup() {
  for ((i=${#pids[@]}-1; i>=0; i--)); do kill "${pids[$i]}" 2>/dev/null || true; done
  wait 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# waitport PORT PID NAME: wait for PORT to accept; if PID exits first, show its log.
waitport() {
  for _ in $(seq 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    if ! kill -0 "$2" 2>/dev/null; then echo "$3 exited before listening on $1:" >&2; tail -5 "$work/$3.log" >&2; return 1; fi
    sleep 0.1
  done
  echo "$3: port $1 never opened" >&2; return 1
}

go build -o "$work/oasis-sim" ./cmd/oasis-sim
go build -o "$work/oasis-router" ./cmd/oasis-router
go build -o "$work/routerload" ./bench/routerload
if [ -n "${POLICY_JSON:-}" ]; then
  printf '%s\n' "$POLICY_JSON" >"$work/policy.json"; policy_name=POLICY_JSON
else
  go run ./bench/routerload/defaultpolicy >"$work/policy.json"; policy_name=default
fi

# Consul dev agent (the flags internal/testutil.StartConsul uses).
chttp=$(freeport) cserf=$(freeport) cserver=$(freeport) cwan=$(freeport)
cat >"$work/consul.json" <<JSON
{"node_name":"bench","data_dir":"$work/consul-data","bind_addr":"127.0.0.1","client_addr":"127.0.0.1",
 "log_level":"warn","disable_update_check":true,
 "ports":{"http":$chttp,"serf_lan":$cserf,"serf_wan":$cwan,"server":$cserver,"dns":-1,"grpc":-1,"grpc_tls":-1,"https":-1}}
JSON
"$CONSUL" agent -dev -config-file="$work/consul.json" >"$work/consul.log" 2>&1 &
consul_pid=$!; pids+=("$consul_pid")
C=http://127.0.0.1:$chttp
for _ in $(seq 200); do
  curl -sf "$C/v1/connect/ca/roots" 2>/dev/null | grep -q RootCert && break
  kill -0 "$consul_pid" 2>/dev/null || { echo "consul exited:" >&2; tail -5 "$work/consul.log" >&2; exit 1; }
  sleep 0.1
done
intentions() { # DEST ALLOWED...: only ALLOWED may call DEST
  local dest=$1 src="" s; shift
  for s in "$@"; do src+="{\"Name\":\"$s\",\"Action\":\"allow\"},"; done
  curl -sf -X PUT "$C/v1/config" -d "{\"Kind\":\"service-intentions\",\"Name\":\"$dest\",\"Sources\":[$src{\"Name\":\"*\",\"Action\":\"deny\"}]}" >/dev/null
}
intentions oasis-router web
intentions oasis-engine oasis-router web

# Engines, registered with a sidecar each; the sidecars run under one
# wrapper process, so that their CPU is one figure (children summed).
direct=() sidecars=() proxy_cmds=""
for i in $(seq "$ENGINES"); do
  p=$(freeport) sp=$(freeport)
  "$work/oasis-sim" serve m --host 127.0.0.1 --port "$p" --speed "$SIM_SPEED" --log-level warn >"$work/sim$i.log" 2>&1 &
  pids+=($!); waitport "$p" "$!" "sim$i"
  curl -sf -X PUT "$C/v1/agent/service/register" -d "{\"ID\":\"engine-$i\",\"Name\":\"oasis-engine\",\"Address\":\"127.0.0.1\",\"Port\":$p,
    \"Meta\":{\"oasis_model\":\"m\"${ENGINE_KIND:+,\"oasis_engine\":\"$ENGINE_KIND\"}},
    \"Connect\":{\"SidecarService\":{\"Port\":$sp,\"Checks\":[{\"Name\":\"listening\",\"TCP\":\"127.0.0.1:$sp\",\"Interval\":\"1s\"},{\"Name\":\"engine\",\"AliasService\":\"engine-$i\"}]}}}"
  direct+=("http://127.0.0.1:$p") sidecars+=("https://127.0.0.1:$sp")
  proxy_cmds+="'$CONSUL' connect proxy -sidecar-for engine-$i -http-addr 127.0.0.1:$chttp -log-level warn & "
done
bash -c "trap 'kill \$(jobs -p) 2>/dev/null' EXIT TERM; $proxy_cmds wait" >"$work/sidecars.log" 2>&1 &
sidecars_pid=$!; pids+=("$sidecars_pid")
for _ in $(seq 300); do
  n=$(curl -sf "$C/v1/health/connect/oasis-engine?passing" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))' 2>/dev/null || true)
  [ "$n" = "$ENGINES" ] && break
  kill -0 "$sidecars_pid" 2>/dev/null || { echo "sidecars exited:" >&2; tail -5 "$work/sidecars.log" >&2; exit 1; }
  sleep 0.1
done
[ "$n" = "$ENGINES" ] || { echo "only $n of $ENGINES sidecars passing:" >&2; curl -s "$C/v1/health/connect/oasis-engine" | head -c 1500 >&2; exit 1; }

scheme=http rtls=() lflags=()
if [ "$TLS" = 1 ]; then
  t="$work/tls"
  bench_tls "$t"
  scheme=https rtls=(-tls-cert "$t/server.pem" -tls-key "$t/server.key") lflags=(-ca "$t/ca.pem")
fi

common=(-discovery consul -consul-addr "127.0.0.1:$chttp" -policy-file "$work/policy.json" -log-level warn)
rport=$(freeport) mport=$(freeport)
"$work/oasis-router" "${common[@]}" -listen "127.0.0.1:$rport" "${rtls[@]}" >"$work/router.log" 2>&1 &
router_pid=$!; pids+=("$router_pid")
mflags=()
if [ -n "$PPROF" ]; then pport=$(freeport); mflags=(-pprof-listen "127.0.0.1:$pport"); fi
"$work/oasis-router" "${common[@]}" -mesh-service oasis-router -mesh-listen "127.0.0.1:$mport" -mesh-engines -listen off "${mflags[@]}" >"$work/router-mesh.log" 2>&1 &
mesh_pid=$!; pids+=("$mesh_pid")
waitport "$rport" "$router_pid" router
waitport "$mport" "$mesh_pid" router-mesh
sleep 2 # discovery and the first scrape

echo "machine: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); $("$CONSUL" version | head -1);" \
  "engines: $ENGINES × oasis-sim --speed $SIM_SPEED behind \`consul connect proxy\` sidecars (Consul's built-in L4 proxy, not Envoy);" \
  "policy: $policy_name $(cat "$work/policy.json");" \
  "router: $scheme listener, engines plain; router-mesh: mTLS (Connect leaf) in, engines through their sidecars"
if [ -n "$PPROF" ]; then
  curl -sf -o "$work/mesh.pprof" "http://127.0.0.1:$pport/debug/pprof/profile?seconds=$PPROF" &
  prof_pid=$!
fi
ids=$(IFS='|'; echo "${direct[*]}") sids=$(IFS='|'; echo "${sidecars[*]}")
if ! "$work/routerload" -model m -phases latency "${lflags[@]}" \
  -mesh-consul "127.0.0.1:$chttp" -mesh-service web -mesh-targets router-mesh=oasis-router,direct-sidecar=oasis-engine \
  -targets "direct=$ids,direct-sidecar=$sids,router=$scheme://127.0.0.1:$rport,router-mesh=https://127.0.0.1:$mport" \
  -cpu-pids "router=$router_pid,router/consul=$consul_pid,router-mesh=$mesh_pid,router-mesh/sidecars=$sidecars_pid,router-mesh/consul=$consul_pid,direct-sidecar/sidecars=$sidecars_pid" \
  "$@"; then
  echo "routerload failed; logs:" >&2; tail -3 "$work/router.log" "$work/router-mesh.log" "$work/sidecars.log" >&2
  exit 1
fi
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [ -n "$PPROF" ]; then
  wait "$prof_pid" || true
  echo "router-mesh CPU profile (${PPROF}s of the run):"
  go tool pprof -top -nodecount 40 "$work/oasis-router" "$work/mesh.pprof" 2>/dev/null | head -50
fi
