#!/usr/bin/env bash
# Answers handed over at the end of the thought, on two real vLLM engines (the CPU build,
# the benchmark model, the GPU-shaped rig's limits): the two engines as one shared pool
# against one think and one answer engine (re-prefill), paired on the same requests at
# loads relative to the shared pool's capacity; beside it what a hand-over costs on idle
# engines, by re-prefill and through vLLM's ExampleConnector, and the twin's forecast for
# the same split, calibrated on this run's steps, with the connector at its measured cost.
# Writes docs/src/benchmarks/migration-real-engine/ (results.json, the raw runs gzipped,
# report.txt, which migration-real-engine.md includes). About 40 minutes on a 2-core
# machine; nothing else should run meanwhile.
#
#   scripts/bench-migration-real.sh                        # measure and report
#   REALAB_REPORT_ONLY=1 scripts/bench-migration-real.sh   # the report again, from the kept data
#
# REALAB_LOADS (default 0.5,0.8), REALAB_ROUNDS (default 2), REALAB_PROMPTS (default 100)
# narrow or widen a run (scripts/realab/migration.py).
set -euo pipefail
source "$(dirname "$0")/real-engine-setup.sh"
OUT_DIR=docs/src/benchmarks/migration-real-engine
mkdir -p "$OUT_DIR/raw"
if [[ -z "${REALAB_REPORT_ONLY:-}" ]]; then
  install_hook
  (cd scripts && "$venv/bin/python" -m realab migration measure "$ROOT" "$model" "$ROOT/$OUT_DIR/results.json")
  work=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["work"])' "$OUT_DIR/results.json")
  rm -f "$OUT_DIR"/raw/*.json.gz
  for f in "$work"/runs/long-*.json "$work"/runs/probe-*.json; do
    gzip -c "$f" > "$OUT_DIR/raw/$(basename "$f").gz"
  done
  # The first engine's step trace (it ran in both configurations): the twin's costs.
  gzip -c "$work/plain-a-steps.jsonl" > "$OUT_DIR/plain-a-steps.jsonl.gz"
fi
# The twin calibrated on this rig's own steps: two engines sharing both cores with the API
# servers, the proxy and the load tester run slower than set 8's one engine with a core
# of its own.
mkdir -p target/realab
gunzip -c "$OUT_DIR/plain-a-steps.jsonl.gz" > target/realab/migration-steps.jsonl
target/release/meridian-sim calibrate --steps target/realab/migration-steps.jsonl \
  --profile-out "$OUT_DIR/rig-profile.toml" --json "$OUT_DIR/calibration.json" --name rig \
  --gpu "none (two engines of the GPU-shaped rig, sharing both cores with delivery)" --model bench-qwen3-v1 \
  --block-size 128 --kv-blocks 100000 --max-num-seqs 32 --max-num-batched-tokens 256 > /dev/null
(cd scripts && "$venv/bin/python" -m realab migration report "$ROOT/$OUT_DIR/results.json" "$ROOT/$OUT_DIR/raw" \
  "$ROOT/$OUT_DIR/report.txt" "$ROOT/target/release/meridian-sim" "$ROOT/$OUT_DIR/rig-profile.toml" rig > /dev/null)
echo "wrote $OUT_DIR/report.txt"
