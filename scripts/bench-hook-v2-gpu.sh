#!/usr/bin/env bash
# The hook's logits-processor step under Model Runner V2 on a GPU (needs an NVIDIA GPU and
# PyTorch; no vLLM): checks it never waits for the device in a step that ends no thought
# and still ends every thought at exactly its token, then times it against an engine step
# under async scheduling. Writes docs/src/benchmarks/hook-v2-gpu.md and its figures
# (docs/src/benchmarks/gpu-step-curve/hook-v2.json); exits non-zero if a check fails. About 2 minutes
# on an H200.
#
# The hook: $MERIDIAN_HOOK_WHEEL if set, else the newest wheel in target/hook-wheels/
# (scripts/test.sh or scripts/install-hook.sh builds it; abi3: one wheel serves Python
# 3.10 and later), installed into a temporary directory first on PYTHONPATH.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
WHEEL="${MERIDIAN_HOOK_WHEEL:-$(ls -t target/hook-wheels/meridian_vllm_hook-*.whl 2>/dev/null | head -1)}"
if [[ -z "$WHEEL" || ! -f "$WHEEL" ]]; then
  echo "no hook wheel: run scripts/install-hook.sh (it builds one into target/hook-wheels/) or set MERIDIAN_HOOK_WHEEL" >&2
  exit 2
fi
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
"$PYTHON" -m pip install --quiet --no-deps --no-index --target "$SITE" "$WHEEL"
JSON="${HOOK_V2_JSON:-docs/src/benchmarks/gpu-step-curve/hook-v2.json}"
PAGE="${HOOK_V2_PAGE:-docs/src/benchmarks/hook-v2-gpu.md}"
PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:scripts${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/bench_hook_v2_gpu.py --json "$JSON" --page "$PAGE" "$@"
