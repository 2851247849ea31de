#!/usr/bin/env bash
# The main job: builds and runs the `meridian` proxy with the documented config.
#
#   scripts/run.sh --twin                            # on the embedded engine twin (simulated; no GPU)
#   scripts/run.sh --upstream http://vllm:8000       # in front of real vLLM servers
#
# Any `meridian serve` flag can follow (--listen, --set path=value, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins -q
exec target/release/meridian serve --config meridian.toml "$@"
