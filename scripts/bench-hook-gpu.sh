#!/usr/bin/env bash
# The vLLM hook's CUDA entropy path on a GPU (needs an NVIDIA GPU and PyTorch with CUDA;
# no vLLM): checks it agrees with the CPU path and keeps to the caller's stream, times a
# call, and writes docs/src/benchmarks/hook-gpu.md. Exits non-zero if a check fails.
#
# The hook's wheel: scripts/hook-wheel.sh says which, and installs it beside PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
source scripts/hook-wheel.sh
PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/bench_hook_gpu.py docs/src/benchmarks/hook-gpu.md
