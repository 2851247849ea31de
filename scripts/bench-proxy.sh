#!/usr/bin/env bash
# Measures what the proxy adds (direct vs through meridian, same run, rising rates) and
# writes docs/src/benchmarks/proxy-overhead.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
cargo bench --locked -p meridian-proxy --bench relay_overhead
