#!/usr/bin/env bash
# What one blocking device read per engine step costs under vLLM-style asynchronous
# scheduling (the hook's ids read, and its entropy read-back): decode steps of a
# Qwen3-8B-shaped model replayed as CUDA graphs on this machine's GPU, with host work
# overlapped and with the reads in between (needs an NVIDIA GPU and PyTorch; no vLLM).
# Writes sync.json under docs/src/benchmarks/gpu-step-curve/ (110 s on an H200, about
# 2 minutes on an H100), then docs/src/benchmarks/hook-gpu-sync.md from it. The page needs
# only Python: `(cd scripts && python3 -m gpucurve sync-report --data DIR)` rewrites it.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT="$(realpath -m "${SYNC_OUT:-docs/src/benchmarks/gpu-step-curve}")"
(cd scripts && PYTHONUNBUFFERED=1 "$PYTHON" -m gpucurve sync --out "$OUT")
(cd scripts && "$PYTHON" -m gpucurve sync-report --data "$OUT")
