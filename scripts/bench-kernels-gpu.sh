#!/usr/bin/env bash
# GPU benchmark and agreement check of the entropy kernels (needs an NVIDIA GPU, its
# driver and PyTorch with CUDA); writes docs/src/benchmarks/kernels-gpu.md.
#
# The library: $MERIDIAN_KERNELS_LIB if set (a libmeridian_kernels.so built elsewhere, e.g.
# on a machine with Rust: `cargo build --release -p meridian-kernels --lib`; it loads CUDA
# at run time, so one build serves both kinds of machine), else built here with cargo.
# NVRTC is found next to PyTorch (the nvidia-cuda-nvrtc wheel) if not on the library path.
# Also runs the Rust GPU tests when cargo is present.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
LIB="${MERIDIAN_KERNELS_LIB:-}"
if [[ -z "$LIB" ]]; then
  if ! command -v cargo >/dev/null; then
    echo "cargo is not installed here: build libmeridian_kernels.so elsewhere" \
         "(cargo build --release -p meridian-kernels --lib) and set MERIDIAN_KERNELS_LIB" >&2
    exit 2
  fi
  cargo build --release --locked -p meridian-kernels --lib
  LIB="$PWD/target/release/libmeridian_kernels.so"
fi
NVRTC_DIR="$("$PYTHON" -c 'import os, nvidia.cuda_nvrtc as n; print(os.path.join(list(n.__path__)[0], "lib"))' 2>/dev/null || true)"
if [[ -n "$NVRTC_DIR" ]]; then
  export LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if command -v cargo >/dev/null; then
  cargo test --locked -p meridian-kernels --test gpu -- --nocapture
fi
"$PYTHON" scripts/bench_kernels_gpu.py "$LIB" docs/src/benchmarks/kernels-gpu.md
