# Sourced (from the repository root) by the GPU benchmarks that run the hook's own wheel
# beside a Python that has PyTorch but no vLLM. Installs the wheel into a temporary
# directory, removed on exit, and exports SITE naming it (put it first on PYTHONPATH).
#
# The wheel: $MERIDIAN_HOOK_WHEEL if set (one built elsewhere), else the newest in
# target/hook-wheels/ (scripts/test.sh and scripts/install-hook.sh build it there). It is
# abi3: one wheel serves Python 3.10 and later.
WHEEL="${MERIDIAN_HOOK_WHEEL:-$(ls -t target/hook-wheels/meridian_vllm_hook-*.whl 2>/dev/null | head -1)}"
if [[ -z "$WHEEL" || ! -f "$WHEEL" ]]; then
  echo "no hook wheel: run scripts/install-hook.sh (it builds one into target/hook-wheels/) or set MERIDIAN_HOOK_WHEEL" >&2
  exit 2
fi
SITE="$(mktemp -d)"
export SITE
trap 'rm -rf "$SITE"' EXIT
"${PYTHON:-python3}" -m pip install --quiet --no-deps --no-index --target "$SITE" "$WHEEL"
