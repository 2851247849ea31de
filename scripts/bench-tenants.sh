#!/usr/bin/env bash
# A tenant that floods the proxy against one that does not, on the embedded engine twin:
# the victim's TTFO, TTOT and every other metric, flooded over alone, with the fair queue,
# with the flood capped, and with tenants off; writes docs/src/benchmarks/tenant-flood.md.
# The twin steps as the H100 measured on the GPU step-time curve (its fitted profile);
#   FLOOD_PROFILE_FILE= FLOOD_PROFILE=h100-qwen3-8b scripts/bench-tenants.sh    on a built-in profile
#   FLOOD_ROUNDS=1 FLOOD_VICTIMS=200 scripts/bench-tenants.sh     a quick look (~5 min)
#   FLOOD_APPEND=1 FLOOD_ROUNDS=4 scripts/bench-tenants.sh        4 more rounds for the page
#     (after its kept ones, with the same FLOOD_* settings, which it checks)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins
cargo bench --locked -p meridian-loadtest --bench tenant_flood
