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
# NVRTC: the directory of PyTorch's own (nvidia/cuda_nvrtc/lib for CUDA 12 wheels,
# nvidia/cu13/lib for CUDA 13) goes first on the library path.
NVRTC_DIR="$("$PYTHON" - <<'PY' 2>/dev/null || true
import glob, os
import nvidia
for root in nvidia.__path__:
    for lib in sorted(glob.glob(os.path.join(root, "*", "lib", "libnvrtc.so*"))):
        name = os.path.basename(lib)
        if "builtins" not in name and ".alt." not in name:
            print(os.path.dirname(lib))
            raise SystemExit
PY
)"
if [[ -n "$NVRTC_DIR" ]]; then
  export LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
# The GPU-vs-CPU agreement tests: through cargo, or a test binary built elsewhere
# (`cargo test --release -p meridian-kernels --test gpu --no-run` prints its path) named
# by $MERIDIAN_KERNELS_GPU_TESTS. Their closing line goes into the page.
tests_log=$(mktemp)
trap 'rm -f "$tests_log"' EXIT
if [[ -n "${MERIDIAN_KERNELS_GPU_TESTS:-}" ]]; then
  "$MERIDIAN_KERNELS_GPU_TESTS" --nocapture --test-threads=1 | tee "$tests_log"
elif command -v cargo >/dev/null; then
  cargo test --locked -p meridian-kernels --test gpu -- --nocapture --test-threads=1 | tee "$tests_log"
fi
MERIDIAN_KERNELS_GPU_TESTS_RESULT="$(grep -m1 '^test result:' "$tests_log" || true)"
if grep -q 'skipped: no CUDA device' "$tests_log"; then
  MERIDIAN_KERNELS_GPU_TESTS_RESULT="$MERIDIAN_KERNELS_GPU_TESTS_RESULT (some skipped: no CUDA device)"
fi
export MERIDIAN_KERNELS_GPU_TESTS_RESULT
"$PYTHON" scripts/bench_kernels_gpu.py "$LIB" docs/src/benchmarks/kernels-gpu.md
