#!/usr/bin/env bash
# Step-time curve of a Qwen3-8B-shaped model on this machine's GPU (needs an NVIDIA GPU
# and PyTorch with CUDA), to check the twin's h100-qwen3-8b profile against a
# measurement: writes the step traces under docs/src/benchmarks/gpu-step-curve/, then,
# where cargo is, fits the twin's cost model to them and rewrites
# docs/src/benchmarks/gpu-step-curve.md. Without cargo here, copy the traces to a machine
# with it and run `(cd scripts && python3 -m gpucurve report)` there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
OUT="$(realpath -m "${STEP_CURVE_OUT:-docs/src/benchmarks/gpu-step-curve}")"
(cd scripts && PYTHONUNBUFFERED=1 "$PYTHON" -m gpucurve measure --out "$OUT")
if command -v cargo >/dev/null; then
  (cd scripts && python3 -m gpucurve report --data "$OUT")
else
  echo "no cargo here: run '(cd scripts && python3 -m gpucurve report --data DIR)' where it is" >&2
fi
