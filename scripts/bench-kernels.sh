#!/usr/bin/env bash
# CPU benchmark of the entropy kernels against NumPy (per core, side by side in one process);
# writes docs/src/benchmarks/kernels.md. NumPy comes from a cached venv (pinned version).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
NUMPY="$(grep -E '^numpy==' tests/python/requirements.txt | head -1)"
VENV="$CACHE/bench-kernels-venv-${NUMPY#numpy==}"
if [[ ! -f "$VENV/.complete" ]]; then
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet "$NUMPY"
  touch "$VENV/.complete"
fi
cargo build --release --locked -p meridian-kernels --lib
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 \
  "$VENV/bin/python" scripts/bench_kernels.py target/release/libmeridian_kernels.so docs/src/benchmarks/kernels.md
