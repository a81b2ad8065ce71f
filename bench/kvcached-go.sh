#!/usr/bin/env bash
# kvcached-go.sh: oasis-kvcached's Go benchmarks with bounded iteration
# counts: RAM-tier GET 256 KiB (and redis-server in the same run), SSD-tier
# GET 1 MiB, QUIC peer fetch 1 MiB latency and 32 MiB throughput, block
# digests. Numbers in BENCHMARKS.md "## oasis-kvcached".
#
# PIN=1 runs each benchmark binary under `chrt -f 10 taskset -c 0,1`
# (SCHED_FIFO: the shared machine's other work no longer preempts it; both
# vCPUs) — redis-server, started by the RAM-tier benchmark, inherits it.
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/kvcached-gobench.XXXXXX)
trap 'rm -rf "$work"' EXIT
pin=()
if [ "${PIN:-0}" = 1 ]; then pin=(chrt -f 10 taskset -c 0,1); fi
run() { # package, bench regexp, benchtime
  local bin="$work/$(basename "$1").test"
  go test -c -o "$bin" "./$1"
  (cd "$1" && "${pin[@]}" "$bin" -test.run XXX -test.bench "$2" -test.benchtime "$3" -test.v 2>&1 |
    grep -E '^Benchmark|GSO')
}
run kvcached/server . 3000x
run kvcached/peer 1MiB 300x
run kvcached/peer 32MiB 30x  # also 32MiBAs4Streams
run internal/blockdigest . 3000x
