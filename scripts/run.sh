#!/usr/bin/env bash
# The main job: builds and runs the `meridian` proxy.
#
#   scripts/run.sh                          # in front of the replaying upstream (no GPU needed)
#   scripts/run.sh --upstream http://vllm:8000 [more `meridian serve` flags]
#
# With no upstream given, it starts `meridian-mock-upstream`, which replays streams
# recorded from a real vLLM, and puts the proxy in front of it. (The engine twin that will
# take that place, a simulated vLLM under load, is still to be built.)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked --bins -q
BIN=target/release

has_upstream=0
for arg in "$@"; do [[ "$arg" == --upstream* ]] && has_upstream=1; done
[[ -n "${MERIDIAN_UPSTREAMS:-}" ]] && has_upstream=1

if [[ $has_upstream -eq 1 ]]; then
  exec "$BIN/meridian" serve --config meridian.toml "$@"
fi

log=$(mktemp)
"$BIN/meridian-mock-upstream" --model Qwen/Qwen3-8B --model openai/gpt-oss-20b >"$log" 2>&1 &
mock=$!
trap 'kill $mock 2>/dev/null' EXIT
for _ in $(seq 50); do grep -q "listening on" "$log" && break; sleep 0.1; done
url=$(grep -o 'http://[^ ]*' "$log" | head -1)
cat <<MSG
replaying upstream (recorded vLLM streams) at $url
try:
  curl -N localhost:8080/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"Qwen/Qwen3-8B","stream":true,"messages":[{"role":"user","content":"hi"}]}'
  curl localhost:8080/metrics
MSG
"$BIN/meridian" serve --config meridian.toml --upstream "$url" "$@"
