#!/usr/bin/env bash
# Measures the load tester's own cost against the engine twin and the twin's speed in
# virtual time; writes docs/src/benchmarks/loadtest.md.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
cargo bench --locked -p meridian-loadtest --bench tester_overhead
