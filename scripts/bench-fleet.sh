#!/usr/bin/env bash
# One, two and four proxy replicas in front of the same engine twins, under each routing
# policy: every engine within its admission limit, the answers' tails against one
# replica's, and the prefix caches' hit rate; writes docs/src/benchmarks/fleet.md.
#   FLEET_ROUNDS=1 FLEET_CONVERSATIONS=60 scripts/bench-fleet.sh     a quick look
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
cargo bench --locked -p meridian-loadtest --bench fleet
