#!/usr/bin/env bash
# The main job: builds and runs the `meridian` proxy with the documented config.
#
#   scripts/run.sh --twin                            # on the embedded engine twin (simulated; no GPU)
#   scripts/run.sh --upstream http://vllm:8000       # in front of real vLLM servers
#
# Any `meridian serve` flag can follow (--listen, --set path=value, ...). Only the proxy's
# binary is built (not the load tester, the twin's own CLI or the benches), so a first
# run compiles what serving needs and nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q -p meridian-proxy --bin meridian
exec target/release/meridian serve --config meridian.toml "$@"
