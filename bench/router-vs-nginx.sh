#!/usr/bin/env bash
# Side-by-side benchmark: oasis-sim engines called directly, through
# oasis-router, and through nginx (Debian package) as a reverse proxy, in one
# run, as users run them by default. Everything binds 127.0.0.1 on free ports
# and is stopped on exit.
#
#   bench/router-vs-nginx.sh [routerload flags...]
#   e.g. BOTH=1 bench/router-vs-nginx.sh -rate 1000 -round 2s -rounds 5 -concurrency 64 -max-tokens 4
#
# What runs:
# - the router with the policy it ships with: the document policy.Default()
#   produces (printed by bench/routerload/defaultpolicy: weighted, prefix and
#   ttft on, so every request is tokenized), its engines declared as oasis-sim
#   (-engines m=host:port@sim) so it tokenizes with the sim's tokenizer;
# - TLS on the client side of both proxies: a throwaway CA and an ECDSA P-256
#   certificate for IP 127.0.0.1 made with openssl in the temp dir; the router
#   gets -tls-cert/-tls-key (HTTP/1.1 and HTTP/2 by ALPN), nginx `listen ... ssl`
#   with TLSv1.2/1.3, a shared session cache and keep-alive; routerload trusts the
#   CA (-ca) and speaks HTTP/1.1 with keep-alive (H2=1: HTTP/2 to both). The
#   engines stay plain HTTP on loopback (router and engines on one node or a
#   private network), and `direct` stays plain HTTP: it is the engines' ceiling.
# - The sims run without KV events. oasis-sim could publish them on a free port
#   (--kv-events-config), but -discovery static carries no oasis_kv_events
#   endpoint per engine, so the router could not subscribe. The prefix term runs
#   on the code path for engines without events: its index is fed by the
#   router's own decisions (oasis_router_prefix_matched_blocks_total counts the
#   hits).
#
# Env:
#   TLS=1 (default; TLS=0: plain HTTP to the router and nginx)
#   BOTH=1      both passes in one invocation, with TLS then without, same engines
#   H2=1        HTTP/2 to the router and nginx (TLS passes; nginx listens `ssl http2`)
#   ENGINE_KIND=sim (default): the router's -engines entries are m=host:port@sim;
#               ENGINE_KIND= (empty) drops the suffix, for a router whose -engines
#               does not know `@engine` (it then tokenizes by bytes, not as the sim;
#               such a router takes m=host:port@sim for an address and fails every
#               request, and the script stops at routerload's warm-up saying so)
#   POLICY_JSON a policy document instead of the default one (e.g. '{"policy":"round_robin"}')
#   ENGINES (default 3), SIM_SPEED (default 1: real-time simulated steps; 0: no
#   waiting, so the proxies are the bottleneck), ROUTER_ENV (extra env for the
#   router, e.g. GOGC=200), ROUTER_1P=1 (also a router with -gomaxprocs 1, as
#   target router-1p), ROUTER_BIN (a prebuilt oasis-router instead of building
#   this tree's), ROUTER_BASE_BIN (also that build of the router, e.g. an older
#   commit's, as target router-base: it has no TLS flags and no `@engine`
#   syntax, so it runs plain HTTP with m=host:port engines and the same policy
#   file; with BOTH=1 it is in the plain pass only, with TLS alone it runs plain
#   as target router-base-http), ROUTER_TRACED=1 (also this router with
#   OpenTelemetry tracing on, every request sampled, exporting over OTLP/HTTP
#   to a local receiver that discards the spans, as target router-traced).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/tls.sh
. bench/tls.sh
ENGINES=${ENGINES:-3}
SIM_SPEED=${SIM_SPEED:-1}
TLS=${TLS:-1}
BOTH=${BOTH:-0}
H2=${H2:-0}
ENGINE_KIND=${ENGINE_KIND-sim}
NGINX=${NGINX:-$(command -v nginx || echo /usr/sbin/nginx)}
[ -x "$NGINX" ] || { echo "nginx not found: apt-get install -y nginx" >&2; exit 1; }
if [ "$BOTH" = 1 ]; then passes=(tls plain); elif [ "$TLS" = 1 ]; then passes=(tls); else passes=(plain); fi

work=$(mktemp -d /tmp/oasis-router-bench.XXXXXX)
pids=() pass_pids=()
cleanup() {
  for p in "${pass_pids[@]}" "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# waitport PORT PID NAME: wait for PORT to accept; if PID exits first, show its log.
waitport() {
  for _ in $(seq 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    if ! kill -0 "$2" 2>/dev/null; then
      echo "$3 exited before listening on $1:" >&2
      grep -m1 'flag provided but not defined' "$work/$3.log" >&2 || tail -5 "$work/$3.log" >&2
      case "$3" in router*) echo "(a router without -tls-cert or \`@engine\` in -engines: TLS=0, ENGINE_KIND=)" >&2 ;; esac
      return 1
    fi
    sleep 0.1
  done
  echo "$3: port $1 never opened" >&2; return 1
}

go build -o "$work/oasis-sim" ./cmd/oasis-sim
if [ -n "${ROUTER_BIN:-}" ]; then cp "$ROUTER_BIN" "$work/oasis-router"; else go build -o "$work/oasis-router" ./cmd/oasis-router; fi
go build -o "$work/routerload" ./bench/routerload
if [ -n "${POLICY_JSON:-}" ]; then
  printf '%s\n' "$POLICY_JSON" >"$work/policy.json"; policy_name=POLICY_JSON
else
  go run ./bench/routerload/defaultpolicy >"$work/policy.json"; policy_name=default
fi

if [[ " ${passes[*]} " == *" tls "* ]]; then
  # Throwaway CA and server certificate for 127.0.0.1, ECDSA P-256, valid a day.
  t="$work/tls"
  bench_tls "$t"
fi

direct=() engines=() base_engines=() upstream=""
for i in $(seq "$ENGINES"); do
  p=$(freeport)
  "$work/oasis-sim" serve m --host 127.0.0.1 --port "$p" --speed "$SIM_SPEED" --log-level warn >"$work/sim$i.log" 2>&1 &
  pids+=($!)
  direct+=("http://127.0.0.1:$p") base_engines+=("m=127.0.0.1:$p") upstream+="    server 127.0.0.1:$p;"$'\n'
  engines+=("m=127.0.0.1:$p${ENGINE_KIND:+@$ENGINE_KIND}")
done
for i in $(seq "$ENGINES"); do waitport "${direct[$((i-1))]##*:}" "${pids[$((i-1))]}" "sim$i"; done
if [ "${ROUTER_TRACED:-0}" = 1 ]; then
  # The OTLP/HTTP receiver of router-traced: answers every export, keeps nothing.
  sinkport=$(freeport)
  python3 - "$sinkport" >"$work/otlp-sink.log" 2>&1 <<'PY' &
import http.server, sys
class Sink(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Sink).serve_forever()
PY
  pids+=($!)
  waitport "$sinkport" "$!" otlp-sink
fi
engines_flag=$(IFS=,; echo "${engines[*]}")

# start NAME BINARY ARGS...: a router with the static engines and policy file,
# log in $work/NAME.log; its pid in $started.
start() {
  local name=$1 bin=$2; shift 2
  # shellcheck disable=SC2086 # ROUTER_ENV is a list of VAR=value words
  env ${ROUTER_ENV:-} "$bin" -discovery static -policy-file "$work/policy.json" -log-level warn "$@" >"$work/$name.log" 2>&1 &
  started=$!
  pass_pids+=("$started")
}

# pass tls|plain: start the proxies for that mode, load them, stop them.
pass() {
  local mode=$1 scheme=http rtls=() ltls="" lflags=() targets pidsF note="" proto="HTTP/1.1 keep-alive"
  if [ "$mode" = tls ]; then
    scheme=https rtls=(-tls-cert "$work/tls/server.pem" -tls-key "$work/tls/server.key") lflags=(-ca "$work/tls/ca.pem")
    ltls=" ssl"
    if [ "$H2" = 1 ]; then ltls+=" http2"; lflags+=(-h2); proto="HTTP/2 by ALPN"; fi
  fi
  local rport nport waits=()
  rport=$(freeport)
  start router "$work/oasis-router" -listen "127.0.0.1:$rport" -engines "$engines_flag" "${rtls[@]}"
  waits+=("$rport $started router")
  targets="direct=$(IFS='|'; echo "${direct[*]}"),router=$scheme://127.0.0.1:$rport"
  pidsF="router=$started"
  local extra_targets="" extra_pids=""
  if [ "${ROUTER_1P:-0}" = 1 ]; then
    local p; p=$(freeport)
    start router-1p "$work/oasis-router" -gomaxprocs 1 -listen "127.0.0.1:$p" -engines "$engines_flag" "${rtls[@]}"
    waits+=("$p $started router-1p")
    extra_targets+=",router-1p=$scheme://127.0.0.1:$p" extra_pids+=",router-1p=$started"
  fi
  if [ "${ROUTER_TRACED:-0}" = 1 ]; then
    local p; p=$(freeport)
    start router-traced "$work/oasis-router" -otlp-endpoint "http://127.0.0.1:$sinkport" -trace-sample-ratio 1 \
      -listen "127.0.0.1:$p" -engines "$engines_flag" "${rtls[@]}"
    waits+=("$p $started router-traced")
    extra_targets+=",router-traced=$scheme://127.0.0.1:$p" extra_pids+=",router-traced=$started"
  fi
  if [ -n "${ROUTER_BASE_BIN:-}" ] && { [ "$mode" = plain ] || [ "$BOTH" != 1 ]; }; then
    local p name=router-base; p=$(freeport)
    if [ "$mode" = tls ]; then name=router-base-http note="; $name: plain HTTP (no TLS flags)"; fi
    start "$name" "$ROUTER_BASE_BIN" -listen "127.0.0.1:$p" -engines "$(IFS=,; echo "${base_engines[*]}")"
    waits+=("$p $started $name")
    extra_targets+=",$name=http://127.0.0.1:$p" extra_pids+=",$name=$started"
  elif [ -n "${ROUTER_BASE_BIN:-}" ]; then
    note="; router-base: in the plain pass"
  fi

  nport=$(freeport)
  mkdir -p "$work/nginx-$mode"
  local n="$work/nginx-$mode" ssl_conf=""
  if [ "$mode" = tls ]; then
    ssl_conf="ssl_certificate $work/tls/server.pem;
    ssl_certificate_key $work/tls/server.key;
    ssl_protocols TLSv1.2 TLSv1.3;
    ssl_session_cache shared:SSL:10m;"
  fi
  cat >"$n/nginx.conf" <<NGX
daemon off;
worker_processes auto;
pid $n/nginx.pid;
error_log $n/error.log warn;
events { worker_connections 8192; }
http {
  access_log off;
  client_body_temp_path $n/body;
  proxy_temp_path $n/proxy;
  fastcgi_temp_path $n/fastcgi;
  uwsgi_temp_path $n/uwsgi;
  scgi_temp_path $n/scgi;
  upstream engines {
$upstream    keepalive 512;
  }
  server {
    listen 127.0.0.1:$nport$ltls;
    $ssl_conf
    keepalive_timeout 75s;
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
  "$NGINX" -c "$n/nginx.conf" -e "$n/error.log" >"$work/nginx-$mode.log" 2>&1 &
  local npid=$!
  pass_pids+=("$npid")
  waits+=("$nport $npid nginx-$mode")
  targets+=",nginx=$scheme://127.0.0.1:$nport$extra_targets" pidsF+=",nginx=$npid$extra_pids"

  local w a
  for w in "${waits[@]}"; do read -r -a a <<<"$w"; waitport "${a[@]}"; done
  sleep 1.5 # first scrape

  echo "machine: $(nproc) cores, $(uname -r), load $(cut -d' ' -f1-3 /proc/loadavg); nginx $("$NGINX" -v 2>&1 | cut -d/ -f2);" \
    "engines: $ENGINES × oasis-sim --speed $SIM_SPEED (router -engines m=host:port${ENGINE_KIND:+@$ENGINE_KIND});" \
    "policy: $policy_name $(cat "$work/policy.json");" \
    "TLS: $([ "$mode" = tls ] && echo "on (router, nginx; ECDSA P-256; engines and direct plain HTTP)" || echo off);" \
    "protocol: $proto$note"
  # -cpu-pids: CPU time per request of the router and of nginx (master and
  # workers) while each was loaded, the comparison least disturbed by other load.
  if ! "$work/routerload" -model m "${lflags[@]}" -cpu-pids "$pidsF" -targets "$targets" "${@:2}"; then
    echo "routerload failed; router log:" >&2; tail -5 "$work/router.log" >&2
    [ -z "$ENGINE_KIND" ] || echo "(a router whose -engines does not know \`@engine\`: ENGINE_KIND=)" >&2
    return 1
  fi
  echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

  local p
  for p in "${pass_pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pass_pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pass_pids=()
}

for i in "${!passes[@]}"; do
  [ "$i" = 0 ] || echo
  pass "${passes[$i]}" "$@"
done
