#!/usr/bin/env bash
# The vLLM hook's CUDA entropy path on a GPU (needs an NVIDIA GPU and PyTorch with CUDA;
# no vLLM): checks it agrees with the CPU path and keeps to the caller's stream, times a
# call, and writes docs/src/benchmarks/hook-gpu.md. Exits non-zero if a check fails.
#
# The hook: $MERIDIAN_HOOK_WHEEL if set (a wheel built elsewhere, e.g. by scripts/test.sh
# into target/hook-wheels/; it is abi3, so one wheel serves Python 3.10 and later), else
# the newest wheel in target/hook-wheels/. It is installed into a temporary directory
# put first on PYTHONPATH, beside the PyTorch this Python already has.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEEL="${MERIDIAN_HOOK_WHEEL:-$(ls -t target/hook-wheels/meridian_vllm_hook-*.whl 2>/dev/null | head -1)}"
if [[ -z "$WHEEL" || ! -f "$WHEEL" ]]; then
  echo "no hook wheel: run scripts/test.sh (it builds one into target/hook-wheels/) or set MERIDIAN_HOOK_WHEEL" >&2
  exit 2
fi
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
"$PYTHON" -m pip install --quiet --no-deps --no-index --target "$SITE" "$WHEEL"
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/bench_hook_gpu.py docs/src/benchmarks/hook-gpu.md
