#!/usr/bin/env bash
# Holds many concurrent streams through the proxy for minutes (10,000 for 10 minutes by
# default) and writes docs/src/benchmarks/soak.md: memory per open stream, memory and
# file descriptors after the streams end, latency added to new requests per minute.
#   SOAK_STREAMS=2000 SOAK_MINUTES=2 scripts/bench-soak.sh     a shorter run
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
cargo bench --locked -p meridian-proxy --bench soak
