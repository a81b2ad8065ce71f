#!/usr/bin/env bash
# Side-by-side benchmark: oasis-sim engines called directly, through
# oasis-router, and through nginx (Debian package) as a reverse proxy, in one
# run. Everything binds 127.0.0.1 on free ports and is stopped on exit.
#
#   bench/router-vs-nginx.sh [routerload flags...]
#   e.g. bench/router-vs-nginx.sh -rate 1000 -round 2s -rounds 3 -concurrency 64
#
# Env: ENGINES (default 3), SIM_SPEED (default 1: real-time simulated steps; 0: no
# waiting, so the proxies are the bottleneck), ROUTER_ENV (extra env for the router, e.g. GOGC=200),
# ROUTER_NET=1 (also a second router on net/http's server, -http-server net, as target router-net),
# ROUTER_1P=1 (also a router with -gomaxprocs 1, as target router-1p), ROUTER_BIN (a prebuilt
# oasis-router instead of building this tree's), ROUTER_BASE_BIN (also that build of the router,
# e.g. an older commit's, as target router-base, for before/after in the same run).
set -euo pipefail
cd "$(dirname "$0")/.."
ENGINES=${ENGINES:-3}
SIM_SPEED=${SIM_SPEED:-1}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
[ -x "$NGINX" ] || { echo "nginx not found: apt-get install -y nginx" >&2; exit 1; }

work=$(mktemp -d /tmp/oasis-router-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
waitport() { for _ in $(seq 100); do (exec 3<>/dev/tcp/127.0.0.1/$1) 2>/dev/null && return 0; sleep 0.1; done; echo "port $1 never opened" >&2; return 1; }

go build -o "$work/oasis-sim" ./cmd/oasis-sim
if [ -n "${ROUTER_BIN:-}" ]; then cp "$ROUTER_BIN" "$work/oasis-router"; else go build -o "$work/oasis-router" ./cmd/oasis-router; fi
go build -o "$work/routerload" ./bench/routerload

direct=() engines=() upstream=""
for i in $(seq "$ENGINES"); do
  p=$(freeport)
  "$work/oasis-sim" serve m --host 127.0.0.1 --port "$p" --speed "$SIM_SPEED" --log-level warn >"$work/sim$i.log" 2>&1 &
  pids+=($!)
  direct+=("http://127.0.0.1:$p"); engines+=("m=127.0.0.1:$p"); upstream+="    server 127.0.0.1:$p;"$'\n'
done

rport=$(freeport)
echo '{"policy":"round_robin"}' >"$work/policy.json"
env ${ROUTER_ENV:-} "$work/oasis-router" -listen "127.0.0.1:$rport" -discovery static -engines "$(IFS=,; echo "${engines[*]}")" \
  -policy-file "$work/policy.json" -log-level warn >"$work/router.log" 2>&1 &
rpid=$!
pids+=($rpid)
extra_targets="" extra_pids=""
if [ "${ROUTER_NET:-0}" = 1 ]; then
  r2port=$(freeport)
  env ${ROUTER_ENV:-} "$work/oasis-router" -http-server net -listen "127.0.0.1:$r2port" -discovery static -engines "$(IFS=,; echo "${engines[*]}")" \
    -policy-file "$work/policy.json" -log-level warn >"$work/router-net.log" 2>&1 &
  pids+=($!)
  extra_targets=",router-net=http://127.0.0.1:$r2port" extra_pids=",router-net=$!"
fi
if [ "${ROUTER_1P:-0}" = 1 ]; then
  r3port=$(freeport)
  env ${ROUTER_ENV:-} "$work/oasis-router" -gomaxprocs 1 -listen "127.0.0.1:$r3port" -discovery static -engines "$(IFS=,; echo "${engines[*]}")" \
    -policy-file "$work/policy.json" -log-level warn >"$work/router-1p.log" 2>&1 &
  pids+=($!)
  extra_targets+=",router-1p=http://127.0.0.1:$r3port" extra_pids+=",router-1p=$!"
fi

if [ -n "${ROUTER_BASE_BIN:-}" ]; then
  r4port=$(freeport)
  env ${ROUTER_ENV:-} "$ROUTER_BASE_BIN" -listen "127.0.0.1:$r4port" -discovery static -engines "$(IFS=,; echo "${engines[*]}")" \
    -policy-file "$work/policy.json" -log-level warn >"$work/router-base.log" 2>&1 &
  pids+=($!)
  extra_targets+=",router-base=http://127.0.0.1:$r4port" extra_pids+=",router-base=$!"
fi

nport=$(freeport)
mkdir -p "$work/nginx"
cat >"$work/nginx/nginx.conf" <<NGX
daemon off;
worker_processes auto;
pid $work/nginx/nginx.pid;
error_log $work/nginx/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  upstream engines {
$upstream    keepalive 512;
  }
  server {
    listen 127.0.0.1:$nport;
    keepalive_requests 1000000;
    location / {
      proxy_pass http://engines;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
    }
  }
}
NGX
"$NGINX" -c "$work/nginx/nginx.conf" -e "$work/nginx/error.log" &
npid=$!
pids+=($npid)

for u in "${direct[@]}"; do waitport "${u##*:}"; done
waitport "$rport"; waitport "$nport"; [ -z "${r2port:-}" ] || waitport "$r2port"; [ -z "${r3port:-}" ] || waitport "$r3port"; [ -z "${r4port:-}" ] || waitport "$r4port"
sleep 1.5 # first discovery/scrape

echo "machine: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); nginx $("$NGINX" -v 2>&1 | cut -d/ -f2); engines: $ENGINES × oasis-sim --speed $SIM_SPEED"
# -cpu-pids: CPU time per request of the router and of nginx (master and
# workers) while each was loaded, the comparison least disturbed by other load.
"$work/routerload" -model m -cpu-pids "router=$rpid,nginx=$npid$extra_pids" \
  -targets "direct=$(IFS='|'; echo "${direct[*]}"),router=http://127.0.0.1:$rport,nginx=http://127.0.0.1:$nport$extra_targets" "$@"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
