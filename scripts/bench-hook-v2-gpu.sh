#!/usr/bin/env bash
# The hook's logits-processor step under Model Runner V2 on a GPU (needs an NVIDIA GPU and
# PyTorch; no vLLM): checks it never waits for the device in a step that ends no thought
# and still ends every thought at exactly its token, then times it against an engine step
# under async scheduling. Writes docs/src/benchmarks/hook-v2-gpu.md and its figures
# (docs/src/benchmarks/gpu-step-curve/hook-v2.json); exits non-zero if a check fails. About 2 minutes
# on an H200.
#
# The hook's wheel: scripts/hook-wheel.sh says which, and installs it beside PyTorch.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
source scripts/hook-wheel.sh
JSON="${HOOK_V2_JSON:-docs/src/benchmarks/gpu-step-curve/hook-v2.json}"
PAGE="${HOOK_V2_PAGE:-docs/src/benchmarks/hook-v2-gpu.md}"
PYTHONUNBUFFERED=1 PYTHONPATH="$SITE:scripts${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" scripts/bench_hook_v2_gpu.py --json "$JSON" --page "$PAGE" "$@"
