#!/usr/bin/env bash
# kvcached-go.sh: oasis-kvcached's Go benchmarks with bounded iteration
# counts: RAM-tier GET 256 KiB (and redis-server in the same run), SSD-tier
# GET 1 MiB, QUIC peer fetch 1 MiB latency and 32 MiB throughput, block
# digests. Numbers in BENCHMARKS.md "## oasis-kvcached".
set -euo pipefail
cd "$(dirname "$0")/.."
go test ./kvcached/server/ -run XXX -bench . -benchtime 3000x
go test ./kvcached/peer/ -run XXX -bench 1MiB -benchtime 300x
go test ./kvcached/peer/ -run XXX -bench 32MiB -benchtime 30x
go test ./internal/blockdigest/ -run XXX -bench . -benchtime 3000x
