#!/usr/bin/env bash
# kvcached-vs-redis.sh: redis-benchmark against oasis-kvcached and redis-server
# in the same run, interleaved, SET/GET with 1 KiB and 1 MiB values,
# pipelined (-P 16) and not. Prints a markdown table of median requests/s
# over ROUNDS rounds and the kvcached/redis ratio.
#
# Needs redis-server and redis-benchmark (Debian: redis-server, redis-tools).
# Usage: bench/kvcached-vs-redis.sh            (ROUNDS=3 N_SMALL=100000 N_LARGE=1000)
#        KVCACHED_DISK=0 bench/kvcached-vs-redis.sh   (kvcached without its SSD tier)
#        CASES="1MiB 1MiB-r1000" bench/kvcached-vs-redis.sh   (a subset of the cases)
#        KVCACHED_BASE_BIN=/path/to/older/oasis-kvcached bench/kvcached-vs-redis.sh
#          (also runs that build, same flags, interleaved: before/after in one run)
#
# redis-benchmark writes one key over and over unless given -r; the -r1000
# cases spread SETs over 1000 keys (1 GiB at 1 MiB), so every value kvcached
# stores is also written to its SSD tier rather than superseded in RAM.
set -euo pipefail

ROUNDS=${ROUNDS:-3}
N_SMALL=${N_SMALL:-100000}
N_LARGE=${N_LARGE:-1000}
KVCACHED_DISK=${KVCACHED_DISK:-1}
root=$(cd "$(dirname "$0")/.." && pwd)
load0=$(cut -d' ' -f1-3 /proc/loadavg)
work=$(mktemp -d /tmp/kvcached-bench.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

for b in redis-server redis-benchmark redis-cli; do
  command -v "$b" >/dev/null || { echo "missing $b (apt-get install -y redis-server redis-tools)" >&2; exit 1; }
done

freeport() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }

(cd "$root" && go build -o "$work/oasis-kvcached" ./cmd/oasis-kvcached)
kv_port=$(freeport); kv_http=$(freeport); rs_port=$(freeport)
disk_flags=()
if [ "$KVCACHED_DISK" = 1 ]; then disk_flags=(--disk-bytes 8GiB --data-dir "$work/kvd"); fi
"$work/oasis-kvcached" --addr "127.0.0.1:$kv_port" --http-addr "127.0.0.1:$kv_http" --ram-bytes 4GiB \
  "${disk_flags[@]}" --log-level warn >"$work/kvcached.log" 2>&1 &
pids+=($!)
targets=(kvcached redis)
wait_ports=("$kv_port" "$rs_port")
if [ -n "${KVCACHED_BASE_BIN:-}" ]; then
  base_port=$(freeport); base_http=$(freeport)
  base_disk=(); [ "$KVCACHED_DISK" = 1 ] && base_disk=(--disk-bytes 8GiB --data-dir "$work/kvd-base")
  "$KVCACHED_BASE_BIN" --addr "127.0.0.1:$base_port" --http-addr "127.0.0.1:$base_http" --ram-bytes 4GiB \
    "${base_disk[@]}" --log-level warn >"$work/kvcached-base.log" 2>&1 &
  pids+=($!)
  targets+=(base)
  wait_ports+=("$base_port")
fi
redis-server --port "$rs_port" --bind 127.0.0.1 --save "" --appendonly no --daemonize no \
  --proto-max-bulk-len 128mb >"$work/redis.log" 2>&1 &
pids+=($!)
for p in "${wait_ports[@]}"; do
  for _ in $(seq 100); do redis-cli -p "$p" ping >/dev/null 2>&1 && break; sleep 0.1; done
done

# cases: name size n clients pipeline keyspace (0: one key)
all_cases=(
  "1KiB 1024 $N_SMALL 50 1 0"
  "1KiB-P16 1024 $N_SMALL 50 16 0"
  "1MiB 1048576 $N_LARGE 8 1 0"
  "1MiB-P16 1048576 $N_LARGE 8 16 0"
  "1MiB-r1000 1048576 $N_LARGE 8 1 1000"
)
cases=()
for c in "${all_cases[@]}"; do
  if [ -z "${CASES:-}" ] || [[ " $CASES " == *" ${c%% *} "* ]]; then cases+=("$c"); fi
done
results="$work/results.csv"
: >"$results"
for r in $(seq "$ROUNDS"); do
  for c in "${cases[@]}"; do
    read -r name size n clients pipe keyspace <<<"$c"
    rflag=(); [ "$keyspace" != 0 ] && rflag=(-r "$keyspace")
    for target in "${targets[@]}"; do
      case $target in kvcached) port=$kv_port ;; redis) port=$rs_port ;; base) port=$base_port ;; esac
      redis-benchmark -h 127.0.0.1 -p "$port" -t set,get -n "$n" -d "$size" -c "$clients" -P "$pipe" "${rflag[@]}" --csv 2>/dev/null |
        awk -F'","' -v t="$target" -v c="$name" 'NR>1 { gsub(/"/,"",$1); gsub(/"/,"",$2); print t","c","$1","$2 }' >>"$results"
    done
  done
done

echo "redis-benchmark, median of $ROUNDS interleaved rounds; kvcached disk tier: $([ "$KVCACHED_DISK" = 1 ] && echo on || echo off); load average $load0 at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
echo
python3 - "$results" <<'PY'
import csv, statistics, sys
rows = {}
for t, case, op, rps in csv.reader(open(sys.argv[1])):
    rows.setdefault((case, op, t), []).append(float(rps))
base = any(k[2] == "base" for k in rows)
# Each round runs kvcached and redis-server back to back, so a round's own
# ratio is the fairest single comparison on a noisy machine: the table gives
# the median of the medians and the range of the per-round ratios.
def spread(a, b):
    rs = [x / y for x, y in zip(a, b) if y]
    return f"{min(rs):.2f}-{max(rs):.2f}" if rs else "-"
if base:
    print("| case | op | kvcached req/s | redis-server req/s | ratio | per-round ratios | base build req/s | base ratio | base per-round |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
else:
    print("| case | op | kvcached req/s | redis-server req/s | ratio | per-round ratios |")
    print("|---|---|---:|---:|---:|---:|")
order = ["1KiB", "1KiB-P16", "1MiB", "1MiB-P16", "1MiB-r1000"]
for case in [c for c in order if any(k[0] == c for k in rows)]:
    for op in ["SET", "GET"]:
        ks = rows.get((case, op, "kvcached"), [0])
        rd = rows.get((case, op, "redis"), [0])
        k, r = statistics.median(ks), statistics.median(rd)
        line = f"| {case} | {op} | {k:,.0f} | {r:,.0f} | {k/r if r else 0:.2f} | {spread(ks, rd)} |"
        if base:
            bs = rows.get((case, op, "base"), [0])
            b = statistics.median(bs)
            line += f" {b:,.0f} | {b/r if r else 0:.2f} | {spread(bs, rd)} |"
        print(line)
PY
