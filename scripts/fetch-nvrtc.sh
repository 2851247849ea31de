#!/usr/bin/env bash
# Caches NVIDIA's NVRTC runtime compiler (the PyPI wheel, no GPU or driver needed) and
# prints the directory holding libnvrtc.so, so the kernels' compile test
# (kernels/tests/gpu.rs: kernels_compile_with_nvrtc) runs on CPU-only machines too.
set -euo pipefail
CACHE="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
VERSION=12.9.86
DIR="$CACHE/nvrtc-$VERSION"
if [[ ! -f "$DIR/.complete" ]]; then
  rm -rf "$DIR"
  python3 -m venv "$DIR" >&2
  "$DIR/bin/pip" install --quiet "nvidia-cuda-nvrtc-cu12==$VERSION" >&2
  touch "$DIR/.complete"
fi
"$DIR/bin/python" -c 'import os, nvidia.cuda_nvrtc as n; print(os.path.join(list(n.__path__)[0], "lib"))'
